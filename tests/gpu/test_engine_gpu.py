"""The real engine on a CUDA GPU: CUDA vLLM 0.32.0, patched, serving the real-shape checkpoint
through `gptoss-spark serve` with `fast` (our MoE kernels through the plugin), via
benchmarks/gpu_engine/run_engine.py. Device runs only: CI has no GPU and no CUDA vLLM.

On a Hopper GPU the profile is fast-hopper (fast with FlashInfer's JIT target for sm_90), on a
GB10 fast itself. Needs ~6 GB of disk for the 2-layer checkpoint (GPTOSS_SPARK_SHAPED_MODEL names
one already written, to save the minute it takes).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _cuda_vllm() -> bool:
    if not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None:
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cuda()


pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not _cuda_vllm(), reason="needs a CUDA GPU and vLLM built for CUDA")]


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory) -> dict:
    sys.path.insert(0, str(REPO))
    from benchmarks.gpu_engine import run_engine
    from gptoss_spark.install.shaped_model import make_shaped_model

    given = os.environ.get("GPTOSS_SPARK_SHAPED_MODEL")
    model = Path(given) if given else make_shaped_model(tmp_path_factory.mktemp("m") / "gpt-oss-120b-2l", layers=2)
    major, _ = torch.cuda.get_device_capability(0)
    profile = "fast" if major == 12 else "fast-hopper"
    out = tmp_path_factory.mktemp("run")
    return run_engine.run_profile(model, profile, False, out, run_engine.PROFILE_DIRS)


def test_fast_starts_on_the_gpu_with_our_kernels(engine_run):
    start = engine_run["starts"][0]
    assert "failed" not in start, start
    assert start["start"]["ready_seconds"] > 0
    assert any("experts repacked" in line for line in engine_run["log_facts"]), "the plugin never replaced the MoE"


def test_fast_answers_like_an_engine(engine_run):
    a = engine_run["answers"]
    assert a["greedy"][0]["status"] == 200 and a["greedy"][0]["usage"]["completion_tokens"] == 32
    assert a["greedy_repeatable"], "greedy decoding gave two different outputs"
    assert a["chat_greedy"]["status"] == 200
    assert a["structured_parses"], a["structured"]


def test_fast_benchmarks_run(engine_run):
    single = engine_run["speed"]["single"]
    assert "rc" not in single, single
