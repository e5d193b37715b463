"""Which profiles can run on this host, and why not: the shipped set as a --cpu install has it.

The host facts (GPU count, MemTotal) are passed in, so the same answers hold on any test box.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gptoss_spark.service import profiles as profiles_mod
from gptoss_spark.admin_cli import render_profiles
from gptoss_spark.service.config import load_settings
from gptoss_spark.base.errors import RequirementError
from gptoss_spark.service.fit import why_not
from gptoss_spark.service.profiles import load_profiles

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cpu_install(tmp_path):
    """Settings like install.sh --cpu's: the demo checkpoint present, no Eagle3 head, both profile dirs."""
    model = tmp_path / "demo-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    s = load_settings(REPO / "etc" / "gptoss-spark.toml")
    return s.model_copy(update={
        "model": s.model.model_copy(update={"dir": model, "eagle3_dir": tmp_path / "no-eagle3",
                                            "eagle3_20b_dir": tmp_path / "no-eagle3"}),  # both heads
        "paths": s.paths.model_copy(update={"profile_dirs": [REPO / "etc" / "profiles", REPO / "etc" / "profiles-cpu"]}),
    })


def test_on_a_cpu_host_only_demo_runs_and_each_other_says_why(cpu_install, tmp_path):
    loaded = load_profiles(cpu_install)
    fit = {name: why_not(p, cpu_install, total_gib=23.4, gpus=0) for name, p in loaded.items()}
    assert fit["demo"] == []
    gpu = f"needs an NVIDIA GPU, none found ({profiles_mod.NVIDIA_GPUS_DIR})"
    assert fit["plain"] == [gpu, "needs 84 GiB, the host has 23.4 GiB in all"]
    assert fit["fast"][0] == gpu  # extends plain: inherits requires.gpu
    assert fit["spec"][0] == gpu and fit["spec"][-1] == f"missing {tmp_path}/no-eagle3/config.json"
    assert fit["spec"][1].startswith(f"needs {loaded['spec'].memory_gib:g} GiB")


def test_on_a_spark_the_shipped_profiles_fit(cpu_install, tmp_path):
    (tmp_path / "no-eagle3").mkdir()
    (tmp_path / "no-eagle3" / "config.json").write_text("{}")
    loaded = load_profiles(cpu_install)
    assert all(why_not(p, cpu_install, total_gib=119.7, gpus=1) == [] for p in loaded.values() if not p.needs_cluster)
    # The two-node profiles say why not on one node.
    assert {n for n, p in loaded.items() if p.needs_cluster} == {"cluster", "demo-cluster"}
    assert all(why_not(p, cpu_install, total_gib=119.7, gpus=1) == ["runs across two nodes; no [cluster] is set "
                                                                      "(docs/CLUSTER.md)"]
               for p in loaded.values() if p.needs_cluster)


def test_a_start_without_a_gpu_is_refused_as_a_requirement(cpu_install, monkeypatch, tmp_path):
    monkeypatch.setattr(profiles_mod, "NVIDIA_GPUS_DIR", tmp_path / "absent")
    plain = load_profiles(cpu_install)["plain"]
    with pytest.raises(RequirementError, match=r"^profile plain: needs an NVIDIA GPU and this host has none"):
        plain.check_requirements(cpu_install)
    gpus = tmp_path / "gpus"
    (gpus / "0000:01:00.0").mkdir(parents=True)
    monkeypatch.setattr(profiles_mod, "NVIDIA_GPUS_DIR", gpus)
    plain.check_requirements(cpu_install)  # one GPU listed: met


def test_the_cli_listing_says_which_cannot_run_here():
    body = {"active": "demo", "state": "ready", "last_good": "demo", "profiles": [
        {"name": "demo", "description": "tiny", "active": True, "why_not": []},
        {"name": "plain", "description": "many users", "active": False,
         "why_not": ["needs an NVIDIA GPU, none found (/proc/driver/nvidia/gpus)", "needs 84 GiB, the host has 23.4 GiB in all"]},
    ]}
    lines = render_profiles(body).splitlines()
    assert lines[1].split() == ["*", "demo", "tiny"]
    assert lines[2].split()[:3] == ["plain", "many", "users"]
    assert lines[3].strip() == ("cannot run here: needs an NVIDIA GPU, none found (/proc/driver/nvidia/gpus); "
                                "needs 84 GiB, the host has 23.4 GiB in all")
    assert len(lines) == 4  # demo runs here: no line for it


# --- The throughput profile's memory, recomputed from gpt-oss-120b's shapes (docs/CONFIGURATION.md) ---
# Every figure below is the seed's (docs/HARDWARE.md) or a shape; the result is a projection for a
# Spark, not a measurement. The test fails when the profile's numbers stop adding up.
GIB = 1024 ** 3
SPARK_CUDA_GIB = 119.7       # what GB10's CUDA reports as total memory (the seed's 0.70 -> 83.8 GiB)
SPARK_ADDRESSABLE_GIB = 121  # ~121 GiB of the 128 GB unified memory addressable (REFERENCE, hardware)
HOST_RESERVE_GIB = 8         # the OS, the supervisor, page cache headroom: kept out of every profile
WEIGHTS_GIB = 61.3           # seed: gpt-oss-120b loaded with MXFP4 experts, bf16 -> MXFP4 dense online
SEED_KV_TOKENS = 273_000     # seed plain at 0.70: vLLM's "KV cache size" (group-aware, max_model_len 32768)
LAYERS, KV_HEADS, HEAD_DIM, WINDOW, BLOCK = 36, 8, 64, 128, 16
FULL_LAYERS = SLIDING_LAYERS = LAYERS // 2  # sliding-window and full attention alternate
FP8 = 1
KV_BYTES_PER_TOKEN_PER_LAYER = 2 * KV_HEADS * HEAD_DIM * FP8            # K and V: 1,024 B
FULL_BYTES_PER_TOKEN = FULL_LAYERS * KV_BYTES_PER_TOKEN_PER_LAYER       # 18,432 B = 18 KiB
SLIDING_TOKENS_PER_REQUEST = (-(-(WINDOW - 1) // BLOCK) + 1) * BLOCK    # 9 blocks of 16 = 144
SLIDING_BYTES_PER_REQUEST = SLIDING_TOKENS_PER_REQUEST * SLIDING_LAYERS * KV_BYTES_PER_TOKEN_PER_LAYER
SEED_OVERHEAD_GIB = 0.70 * SPARK_CUDA_GIB - WEIGHTS_GIB - SEED_KV_TOKENS / 32768 * (
    32768 * FULL_BYTES_PER_TOKEN + SLIDING_BYTES_PER_REQUEST) / GIB    # activations, graphs, runtime: ~17.8
SAMPLER_256_GIB = 3 * 256 * 201_088 * 4 / GIB + 0.5  # fp32 logits and two temporaries at 256 rows, + graphs to 512
BENCH_CONTEXT = 1024 + 128   # the published curves' request (pp1024 + tg128)


def _arg(profile, flag):
    args = list(profile.args)
    return args[len(args) - 1 - args[::-1].index(flag) + 1]


def test_throughput_profile_memory_adds_up_on_a_121_gib_spark(cpu_install):
    p = load_profiles(cpu_install)["throughput"]
    util, slots = float(_arg(p, "--gpu-memory-utilization")), int(_arg(p, "--max-num-seqs"))
    assert slots == 256
    assert FULL_BYTES_PER_TOKEN == 18_432 and SLIDING_TOKENS_PER_REQUEST == 144
    assert 17 < SEED_OVERHEAD_GIB < 18.5
    budget = util * SPARK_CUDA_GIB
    kv_gib = budget - WEIGHTS_GIB - SEED_OVERHEAD_GIB - SAMPLER_256_GIB
    full_tokens = (kv_gib * GIB - slots * SLIDING_BYTES_PER_REQUEST) / FULL_BYTES_PER_TOKEN
    # What vLLM checks at start: one request of max_model_len fits. What the slots are for: every
    # slot holding a request of the published benchmarks' length at once, with room to spare.
    assert full_tokens >= int(_arg(p, "--max-model-len"))
    assert full_tokens >= 2 * slots * BENCH_CONTEXT, f"{full_tokens:.0f} tokens for {slots} slots"
    # The memory guard's figure covers what vLLM takes, and the guard's floor still fits the Spark.
    assert budget <= p.memory_gib <= budget + 1
    assert p.memory_gib + cpu_install.memory.start_floor_gib <= SPARK_ADDRESSABLE_GIB - HOST_RESERVE_GIB
    print(f"\n[projection] throughput: KV {kv_gib:.1f} GiB = {full_tokens / 1000:.0f}k tokens, "
          f"{full_tokens / slots:.0f} per slot at {slots}")


def test_plain_memory_share_would_not_hold_256_slots(cpu_install):
    """Why throughput raises the share: at plain's 0.70 the KV left for 256 slots is under a benchmark request each."""
    plain = load_profiles(cpu_install)["plain"]
    kv_gib = float(_arg(plain, "--gpu-memory-utilization")) * SPARK_CUDA_GIB - WEIGHTS_GIB - SEED_OVERHEAD_GIB \
        - SAMPLER_256_GIB
    full_tokens = (kv_gib * GIB - 256 * SLIDING_BYTES_PER_REQUEST) / FULL_BYTES_PER_TOKEN
    assert full_tokens < 256 * BENCH_CONTEXT
