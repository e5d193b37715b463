"""The warm key and markers of `gptoss-spark warmup` (the engine runs in tests/integration/test_warm_start.py)."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from gptoss_spark import warmup
from gptoss_spark.cli import main
from gptoss_spark.service.config import Settings
from gptoss_spark.service.profiles import load_profiles
from gptoss_spark.service.startup import StartupRecord


def setup(tmp: Path, args: str = '["--max-num-seqs", "4"]') -> Settings:
    (tmp / "p").mkdir(exist_ok=True)
    (tmp / "m").mkdir(exist_ok=True)
    (tmp / "m" / "config.json").write_text("{}")
    (tmp / "p" / "demo.toml").write_text(f'description = "d"\n[engine]\nargs = {args}\n')
    (tmp / "p" / "gpu.toml").write_text('description = "g"\n[requires]\ngpu = true\n')
    cfg = tmp / "gs.toml"
    cfg.write_text(f'default_profile = "demo"\n[model]\ndir = "{tmp / "m"}"\n'
                   f'[paths]\nstate_dir = "{tmp / "s"}"\nprofile_dirs = ["{tmp / "p"}"]\n')
    return Settings.model_validate({"model": {"dir": str(tmp / "m")},
                                    "paths": {"state_dir": str(tmp / "s"), "profile_dirs": [str(tmp / "p")]}})


def ready_record(name: str) -> StartupRecord:
    rec = StartupRecord(name, spawned_at=0.0)
    rec.mark("canary", now=3.0)
    return rec


def test_key_follows_versions_and_arguments_not_our_own_version(tmp_path, monkeypatch):
    s = setup(tmp_path)
    demo = load_profiles(s)["demo"]
    key = warmup.warm_key(s, demo)
    assert warmup.warm_key(s, demo) == key  # stable
    real = importlib.metadata.version

    def other_torch(name):
        return "9.9.9" if name == "torch" else real(name)

    monkeypatch.setattr(importlib.metadata, "version", other_torch)
    assert warmup.warm_key(s, demo) != key  # torch changed: the compiled kernels do not fit
    monkeypatch.setattr(importlib.metadata, "version", real)
    monkeypatch.setattr("gptoss_spark.__version__", "99.0")
    assert warmup.warm_key(s, demo) == key  # an upgrade of this package alone keeps the caches warm
    setup(tmp_path, '["--max-num-seqs", "8"]')
    assert warmup.warm_key(s, load_profiles(s)["demo"]) != key


def test_markers_say_warm_stale_or_never(tmp_path):
    s = setup(tmp_path)
    demo = load_profiles(s)["demo"]
    assert warmup.warm_state(s, demo) == "never"
    warmup.write_marker(s, demo, ready_record("demo"))
    doc = json.loads(warmup.marker_path(s, "demo").read_text())
    assert doc["key"] == warmup.warm_key(s, demo) and doc["ready_seconds"] == 3.0
    assert warmup.warm_state(s, demo) == "warm"
    setup(tmp_path, '["--max-num-seqs", "8"]')
    assert warmup.warm_state(s, load_profiles(s)["demo"]) == "stale"
    warmup.marker_path(s, "demo").write_text("{not json")
    assert warmup.warm_state(s, demo) == "never"


def test_check_lists_profiles_and_exits_1_while_one_is_cold(tmp_path, capsys, monkeypatch):
    s = setup(tmp_path)
    monkeypatch.setattr("gptoss_spark.service.profiles.nvidia_gpu_count", lambda: 0)
    cfg = str(tmp_path / "gs.toml")
    assert main(["warmup", "--check", "--config", cfg]) == 1
    assert capsys.readouterr().out.split() == ["demo", "never"]  # gpu cannot run here: not listed
    warmup.write_marker(s, load_profiles(s)["demo"], ready_record("demo"))
    assert main(["warmup", "--check", "--config", cfg]) == 0
    assert main(["warmup", "--check", "gpu", "--config", cfg]) == 1
    assert "cannot run here" in capsys.readouterr().out


def test_unknown_or_unrunnable_profile_is_one_line(tmp_path, capsys, monkeypatch):
    setup(tmp_path)
    monkeypatch.setattr("gptoss_spark.service.profiles.nvidia_gpu_count", lambda: 0)
    cfg = str(tmp_path / "gs.toml")
    assert main(["warmup", "nope", "--config", cfg]) == warmup.WarmupError.exit_code
    assert "unknown profile(s) nope; known: demo, gpu" in capsys.readouterr().err
    assert main(["warmup", "gpu", "--config", cfg]) == warmup.WarmupError.exit_code
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "profile gpu cannot run on this host" in err


def test_requests_cover_greedy_sampled_and_structured_output():
    reqs = {what: body for what, _path, body in warmup.warm_requests("gptoss")}
    assert reqs["greedy"]["temperature"] == 0
    assert reqs["sampled"]["top_k"] > 0 and reqs["sampled"]["top_p"] < 1
    assert reqs["structured"]["response_format"]["type"] == "json_schema"


@pytest.mark.parametrize("text,cuda", [("cuda = '13.0'\n", "13.0"), ("cuda: Optional[str] = None\n", "None")])
def test_torch_cuda_version_is_read_without_importing_torch(tmp_path, monkeypatch, text, cuda):
    f = tmp_path / "torch" / "version.py"
    f.parent.mkdir()
    f.write_text(text)


    entry = importlib.metadata.PackagePath("torch/version.py")
    entry.locate = lambda: f  # type: ignore[method-assign]
    monkeypatch.setattr(importlib.metadata, "files", lambda name: [entry])
    assert warmup.torch_cuda_version() == cuda
