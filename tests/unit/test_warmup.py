"""The warm key and markers of `gptoss-spark warmup` (the engine runs in tests/integration/test_warm_start.py)."""

from __future__ import annotations

import importlib.metadata
import json
import tomllib
from pathlib import Path

import pytest

from gptoss_spark import warmup
from gptoss_spark.cli import main
from gptoss_spark.service.config import Settings
from gptoss_spark.service.profiles import load_profiles
from gptoss_spark.service.startup import StartupRecord


REPO = Path(__file__).resolve().parents[2]


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


def test_key_follows_the_vllm_patches_applied_to_the_engines_venv(tmp_path):
    s = setup(tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    s = s.model_copy(update={"engine": s.engine.model_copy(update={"python": str(venv / "bin" / "python")})})
    demo = load_profiles(s)["demo"]
    unpatched = warmup.warm_key(s, demo)
    manifest = venv / "gptoss-spark-patches.json"  # what `gptoss-spark patches apply` writes (patching.py)
    manifest.write_text(json.dumps({"patch_set": "aaaa", "patches": ["01-x.patch"]}))
    patched = warmup.warm_key(s, demo)
    assert warmup.applied_patches(s) == "aaaa" and patched != unpatched
    # An upgrade whose patch changes a patched file: a new ident, so the install warms up again.
    manifest.write_text(json.dumps({"patch_set": "bbbb", "patches": ["01-x.patch"]}))
    assert warmup.warm_key(s, demo) not in (patched, unpatched)
    manifest.write_text("{torn")
    assert warmup.warm_key(s, demo) == unpatched


def test_key_follows_our_code_inside_the_engine_and_nothing_else_of_ours(tmp_path, monkeypatch):
    s = setup(tmp_path)
    demo = load_profiles(s)["demo"]
    pkg = tmp_path / "pkg"
    for rel in ("engine_hooks/cute_dsl_cache.py", "kernels/device/moe_down.py", "service/supervisor.py"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text("x = 1\n")
    monkeypatch.setattr("gptoss_spark.service.warm_marker.PACKAGE_ROOT", pkg)
    key = warmup.warm_key(s, demo)
    (pkg / "service" / "supervisor.py").write_text("x = 2\n")
    assert warmup.warm_key(s, demo) == key  # the supervisor compiles nothing in the engine
    (pkg / "kernels" / "device" / "moe_down.py").write_text("x = 2\n")
    changed = warmup.warm_key(s, demo)
    assert changed != key  # a Triton kernel of ours changed: its first start compiles it
    (pkg / "engine_hooks" / "cute_dsl_cache.py").write_text("x = 2\n")
    assert warmup.warm_key(s, demo) != changed


def test_engine_code_is_every_vllm_plugin_we_register():
    """A plugin added to pyproject.toml runs inside the engine: its code belongs in the warm key."""
    plugins = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["vllm.general_plugins"]
    packages = {target.split(":")[0].split(".")[1] for target in plugins.values()}
    assert packages == set(warmup.ENGINE_CODE)


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


def setup_pair(tmp: Path) -> str:
    """A head node's config: [cluster] set, a one-node profile and a profile across the pair."""
    setup(tmp)
    (tmp / "p" / "pair.toml").write_text('description = "c"\n[engine]\nargs = []\n[requires]\ncluster = true\n')
    cfg = tmp / "gs.toml"
    cfg.write_text(f'default_profile = "pair"\n[model]\ndir = "{tmp / "m"}"\n'
                   f'[paths]\nstate_dir = "{tmp / "s"}"\nprofile_dirs = ["{tmp / "p"}"]\n'
                   '[admin]\nhost = "10.0.0.1"\n'
                   '[cluster]\nrole = "head"\naddress = "10.0.0.1"\npeer = "10.0.0.2"\ninterface = "eth1"\n')
    return str(cfg)


def test_a_profile_across_two_nodes_is_left_to_its_first_start_on_the_pair(tmp_path, capsys, monkeypatch):
    """Started alone, a cluster profile's head waits for the worker's rank and never gets ready: the
    installer's warm-up would end in exit 32. It is skipped, and the output says why."""
    cfg = setup_pair(tmp_path)
    monkeypatch.setattr("gptoss_spark.service.profiles.nvidia_gpu_count", lambda: 0)

    async def must_not_start(*a, **kw):
        raise AssertionError("warmup started an engine")

    monkeypatch.setattr(warmup, "warm_one", must_not_start)
    assert main(["warmup", "--if-cold", "--if-room", "--config", cfg]) == 0
    out = capsys.readouterr().out
    assert "pair: skipped, runs across the two nodes of [cluster]" in out
    assert "its first start on the pair is its warm-up" in out and "warm-up done: 0 profile(s)" in out
    assert main(["warmup", "pair", "--config", cfg]) == 0  # named: skipped the same way, not an error
    assert main(["warmup", "--check", "--config", cfg]) == 1  # it is not warm, and --check says why
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.split()[:2] == ["pair", "never"] and "its first start on the pair is its warm-up" in line


def test_the_warm_up_engine_listens_on_a_free_loopback_port_with_the_services_caches(tmp_path, monkeypatch):
    """Beside a running service (or before it starts on an upgrade) the warm-up's engine must not take
    engine.port; its caches and key stay the service's, so the service's next start is warm."""
    import asyncio
    import socket

    from gptoss_spark.service.engine import build_argv, build_env

    settings = setup(tmp_path)
    profile = load_profiles(settings)["demo"]
    seen = {}

    class Spawned(Exception):
        pass

    class CapturingEngine:
        def __init__(self, s, p):
            seen["argv"] = build_argv(s, p)
            seen["env"] = build_env(s, p, tmp_path, base={})
            seen["key"] = warmup.warm_key(s, p)
            raise Spawned

    monkeypatch.setattr(warmup, "EngineProcess", CapturingEngine)
    with pytest.raises(Spawned):
        asyncio.run(warmup.warm_one(settings, profile))
    argv = seen["argv"]
    port = int(argv[argv.index("--port") + 1])
    assert port != settings.engine.port and argv[argv.index("--host") + 1] == "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free: nothing else listens there
    service_env = build_env(settings, profile, tmp_path, base={})
    assert seen["env"] == service_env and seen["key"] == warmup.warm_key(settings, profile)


def test_the_warm_up_engines_output_goes_to_its_log_file_and_the_terminal_gets_progress(tmp_path, capsys,
                                                                                        monkeypatch):
    """The installer's terminal was mostly the warm-up engine's raw log (banner, `Route:` lines,
    nanobind's leak report): those lines go to one file, named in one line."""
    import structlog

    from gptoss_spark.service.engine import engine_log

    setup(tmp_path)
    cfg = str(tmp_path / "gs.toml")

    async def engine_that_logs(settings, profile, say=print):
        engine_log.info("(APIServer pid=5) INFO 12-07 10:00:00 [api_server.py:1] vLLM API server version 0.32.0",
                        pid=5, profile=profile.name)
        say(f"  {profile.name}: weights (from 3 s after spawn)")
        return ready_record(profile.name)

    monkeypatch.setattr(warmup, "warm_one", engine_that_logs)
    monkeypatch.setattr(warmup.MemoryGuard, "start_refusal", lambda self, gib: None)
    before = structlog.get_config()
    assert main(["warmup", "demo", "--config", cfg]) == 0
    out = capsys.readouterr().out
    log = tmp_path / "s" / "cache" / "warm" / "engine.log"
    assert f"the warm-up engine's log: {log}" in out and "demo: weights (from 3 s after spawn)" in out
    assert "vLLM API server version" not in out
    assert "vLLM API server version 0.32.0" in log.read_text()
    assert structlog.get_config()["logger_factory"] is before["logger_factory"]  # put back afterwards


def test_the_services_copy_of_the_patch_manifest_name_is_the_installers():
    from gptoss_spark.install.patching import MANIFEST_NAME
    from gptoss_spark.service.warm_marker import PATCH_MANIFEST

    assert PATCH_MANIFEST == MANIFEST_NAME
