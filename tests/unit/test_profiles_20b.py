"""The gpt-oss-20b profiles: each is plain/fast/spec's counterpart, refused on a 120b checkpoint (and
the other way round), and plain-20b's memory estimate fits beside plain's on a Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptoss_spark.base.errors import ConfigError, RequirementError
from gptoss_spark.service import profiles as profiles_mod
from gptoss_spark.service.config import Settings, load_settings
from gptoss_spark.service.fit import why_not
from gptoss_spark.service.profiles import _options, load_profiles

REPO = Path(__file__).resolve().parents[2]
SPARK_GIB = 119.7  # what a GB10 reports (docs/HARDWARE.md)


def checkpoint(d: Path, layers: int, experts: int) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "num_local_experts": experts}))
    return d


@pytest.fixture
def spark(tmp_path, monkeypatch):
    (tmp_path / "gpus" / "0000:01:00.0").mkdir(parents=True)
    monkeypatch.setattr(profiles_mod, "NVIDIA_GPUS_DIR", tmp_path / "gpus")

    def settings_for(model_dir: Path):
        cfg = tmp_path / "gs.toml"
        cfg.write_text(f'[model]\ndir = "{model_dir}"\neagle3_dir = "{tmp_path}/e"\n'
                       f'[paths]\nprofile_dirs = ["{REPO}/etc/profiles"]\n')
        s = load_settings(cfg)
        return s, load_profiles(s)

    return settings_for


def arg(profile, flag: str) -> str:
    return profile.args[profile.args.index(flag) + 1]


def test_each_20b_profile_is_its_120b_counterpart_for_the_20b(spark, tmp_path):
    _, p = spark(checkpoint(tmp_path / "gpt-oss-20b", 24, 32))
    assert {n for n, x in p.items() if x.model == "gpt-oss-20b"} == {"plain-20b", "fast-20b", "spec-20b"}
    assert {n for n, x in p.items() if x.model == "gpt-oss-120b"} == {"plain", "fast", "spec", "cluster",
                                                                         "throughput", "auto"}
    plain, plain20 = p["plain"], p["plain-20b"]
    # The same engine flags as plain but the memory budget; MXFP4 dense layers and lm_head included.
    differ = {o[0] for o in _options(plain.args)} ^ {o[0] for o in _options(plain20.args)}
    assert differ == set()
    assert [o for o in _options(plain.args) if o not in _options(plain20.args)] == \
        [["--gpu-memory-utilization", "0.70"]]
    assert plain20.env == plain.env and plain20.env["GPTOSS_SPARK_MXFP4_LM_HEAD"] == "1"
    assert arg(plain20, "--quantization-config") == arg(plain, "--quantization-config")
    # fast-20b is plain-20b + the kernels exactly as fast is plain + the kernels.
    fast, fast20 = p["fast"], p["fast-20b"]
    assert fast20.env == {**plain20.env, "GPTOSS_SPARK_MOE": "triton"}
    assert [o for o in _options(fast20.args) if o not in _options(plain20.args)] == \
        [o for o in _options(fast.args) if o not in _options(plain.args)]
    # spec-20b: K=1, 2 slots, the head required.
    spec20 = p["spec-20b"]
    assert arg(spec20, "--max-num-seqs") == "2" and "--max-num-batched-tokens" not in spec20.args
    assert json.loads(arg(spec20, "--speculative-config"))["num_speculative_tokens"] == 1
    assert spec20.required_paths == ("{eagle3_20b_dir}/config.json",)


def test_spec_and_spec_20b_draft_with_their_own_heads(spark, tmp_path):
    """spec-20b took model.eagle3_dir, the 120b head: it has model.eagle3_20b_dir, and a settings file
    without that key (every install before it) means gpt-oss-20b-Eagle3 beside eagle3_dir, where
    `model pull gpt-oss-20b-eagle3` puts it."""
    from gptoss_spark.model_cli import dir_for
    from gptoss_spark.models.catalog import CATALOG

    s, p = spark(checkpoint(tmp_path / "gpt-oss-20b", 24, 32))
    assert s.model.eagle3_20b_dir == tmp_path / "gpt-oss-20b-Eagle3"
    head = lambda name: json.loads(p[name].engine_args(s)[p[name].engine_args(s).index("--speculative-config") + 1])
    assert head("spec")["model"] == f"{tmp_path}/e"
    assert head("spec-20b")["model"] == f"{tmp_path}/gpt-oss-20b-Eagle3"
    assert dir_for(CATALOG["gpt-oss-20b-eagle3"], s) == tmp_path / "gpt-oss-20b-Eagle3"
    cfg = tmp_path / "own.toml"
    cfg.write_text(f'[model]\ndir = "{tmp_path}/gpt-oss-20b"\neagle3_20b_dir = "{tmp_path}/heads/20b"\n'
                   f'[paths]\nprofile_dirs = ["{REPO}/etc/profiles"]\n')
    s2 = load_settings(cfg)
    assert s2.model.eagle3_20b_dir == tmp_path / "heads" / "20b"
    assert dir_for(CATALOG["gpt-oss-20b-eagle3"], s2) == tmp_path / "heads" / "20b"
    assert load_settings(REPO / "etc" / "gptoss-spark.toml").model.eagle3_20b_dir == \
        Settings().model.eagle3_20b_dir == Path("/srv/models/gpt-oss-20b-Eagle3")  # the shipped file: the default


def test_a_20b_profile_is_refused_on_a_120b_checkpoint_and_the_other_way_round(spark, tmp_path):
    s, p = spark(checkpoint(tmp_path / "gpt-oss-120b", 36, 128))
    p["plain"].check_requirements(s)
    with pytest.raises(RequirementError, match=rf"^profile plain-20b: is for gpt-oss-20b; {tmp_path}/gpt-oss-120b "
                                               r"holds gpt-oss-120b \(36 layers, 128 experts\); pick a profile"):
        p["plain-20b"].check_requirements(s)
    assert why_not(p["fast-20b"], s, total_gib=SPARK_GIB, gpus=1) == [
        f"is for gpt-oss-20b; {tmp_path}/gpt-oss-120b holds gpt-oss-120b (36 layers, 128 experts)"]
    s, p = spark(checkpoint(tmp_path / "gpt-oss-20b", 24, 32))
    p["plain-20b"].check_requirements(s)
    with pytest.raises(RequirementError, match=r"^profile plain: is for gpt-oss-120b; .* holds gpt-oss-20b"):
        p["plain"].check_requirements(s)


def test_plain_20b_fits_beside_plain_on_a_spark(spark, tmp_path):
    s, p = spark(checkpoint(tmp_path / "m", 24, 32))
    floor = s.memory.start_floor_gib
    assert p["plain"].memory_gib + p["plain-20b"].memory_gib + floor <= SPARK_GIB
    assert p["spec"].memory_gib + p["spec-20b"].memory_gib + floor <= SPARK_GIB
    # Its vLLM budget (utilization x what the GB10 reports) plus ~2 GiB of process is its memory_gib.
    assert float(arg(p["plain-20b"], "--gpu-memory-utilization")) * SPARK_GIB + 2 <= p["plain-20b"].memory_gib


def test_an_unknown_model_name_is_a_config_error(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "x.toml").write_text('description = "x"\nmodel = "gpt-oss-200b"\n')
    cfg = tmp_path / "gs.toml"
    cfg.write_text(f'[paths]\nprofile_dirs = ["{d}"]\n')
    with pytest.raises(ConfigError, match=r"x.toml: model: .*unknown model 'gpt-oss-200b'; name one of "
                                          r"gpt-oss-120b, gpt-oss-20b"):
        load_profiles(load_settings(cfg))
