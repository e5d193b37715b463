"""Alerts end to end: the supervisor (stand-in engine, for faults on demand) gives up, trips the
memory guard, restarts a wedged engine; each event reaches a real HTTP receiver on 127.0.0.1
and a real command, as one JSON document; a dead receiver or a hanging command is logged and
blocks nothing.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import structlog
import structlog.testing

from gptoss_spark.service.alerts import Alerter
from gptoss_spark.service.config import AlertSettings
from gptoss_spark.service.states import State
from gptoss_spark.base.exit_codes import EXIT_GAVE_UP, EXIT_OK

from tests.helpers.supervisor_settings import FakeMemory, free_port, make_settings
from tests.integration.test_supervisor_faults import Harness, run

pytestmark = pytest.mark.integration

KEYS = {"event", "state", "profile", "reason", "host", "time"}


class Receiver:
    """A webhook receiver: keeps every POSTed JSON body; `hang` seconds before answering."""

    def __init__(self, hang: float = 0.0):
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                threading.Event().wait(hang)
                outer.bodies.append({"content_type": self.headers["Content-Type"], **json.loads(body)})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def alert_settings(tmp_path, url: str, **kw) -> dict:
    # The command appends its stdin (one document) as a line to a file.
    script = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')"
    return {"webhook_url": url, "command": [sys.executable, "-c", script, str(tmp_path / "alerts.jsonl")],
            "timeout": 5, **kw}


def command_docs(tmp_path) -> list[dict]:
    f = tmp_path / "alerts.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def test_giving_up_alerts_by_webhook_and_command(tmp_path, receiver):
    async def scenario():
        s = make_settings(tmp_path, {"bad": "load=0.3,crash_on_load"}, alerts=alert_settings(tmp_path, receiver.url))
        h = Harness(tmp_path, s)
        h.start()
        assert await asyncio.wait_for(h.task, 30) == EXIT_GAVE_UP  # run() waited for the sends
        h.notify.close()
    run(scenario())
    assert len(receiver.bodies) == 1, receiver.bodies
    doc = receiver.bodies[0]
    assert doc.pop("content_type") == "application/json" and set(doc) == KEYS
    assert (doc["event"], doc["state"], doc["profile"], doc["host"]) == ("gave_up", "failed", "bad", socket.gethostname())
    # the same crash twice before ready: given up at once (states.hopeless), the alert says so
    assert doc["reason"].startswith("gave up at once, the engine failed the same way twice in a row: "
                                    "engine exited with code 1 while loading")
    assert command_docs(tmp_path) == [doc]


def test_memory_guard_and_wedge_alert_once_each(tmp_path, receiver):
    async def scenario():
        mem = FakeMemory()
        s = make_settings(tmp_path, {"ok": "", "wedgy": "wedge_after=1"}, alerts=alert_settings(tmp_path, receiver.url))
        h = Harness(tmp_path, s, memory=mem)
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        mem.available_gib = 1.5
        await h.until(lambda: h.sup.state in (State.BACKOFF, State.STARTING), what="guard trip")
        mem.available_gib = 100
        await h.until(lambda: h.sup.state == State.READY, what="recovered")
        op = h.sup.request_switch("wedgy")
        await asyncio.wait_for(op.done.wait(), 20)
        first = h.sup.engine.pid
        await h.until(lambda: h.sup.engine.pid != first and h.sup.state == State.READY, what="restart after wedge")
        await h.until(lambda: len(receiver.bodies) >= 2 and len(command_docs(tmp_path)) >= 2, what="alerts")
        assert await h.stop() == EXIT_OK
    run(scenario())
    events = [(d["event"], d["profile"]) for d in receiver.bodies]
    assert events[:2] == [("memory_guard", "ok"), ("wedged", "wedgy")], receiver.bodies
    assert receiver.bodies[0]["reason"] == "memory guard: MemAvailable 1.50 GiB below the danger line 2 GiB"
    assert receiver.bodies[1]["reason"].startswith("wedged: /health answers but canary")
    assert [d["event"] for d in command_docs(tmp_path)][:2] == ["memory_guard", "wedged"]


def test_a_send_that_fails_or_hangs_is_logged_and_blocks_nothing(tmp_path):
    hanging = Receiver(hang=30)
    dead_url = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there

    async def scenario():
        results = {}
        for name, settings in {
            "refused": AlertSettings(webhook_url=dead_url, timeout=2),
            "hanging": AlertSettings(webhook_url=hanging.url, timeout=1),
            "command": AlertSettings(command=[sys.executable, "-c", "import time; time.sleep(30)"], timeout=1),
            "exit": AlertSettings(command=[sys.executable, "-c", "import sys; sys.exit('nope')"], timeout=5),
        }.items():
            a = Alerter(settings)
            a.notify("gave_up", "failed", "plain", "gave up: test")
            queued = sum(not t.done() for t in a._tasks)  # notify() returned with the send still to run
            await a.drain()
            results[name] = (queued, a.sent, a.failed)
        return results

    try:
        with structlog.testing.capture_logs() as logged:
            results = run(scenario())
    finally:
        hanging.close()
    for name, (queued, sent, failed) in results.items():
        assert (sent, failed) == (0, 1), (name, results)
        assert queued == 1, (name, results)
    failures = [e for e in logged if e["event"] == "alert not delivered"]
    assert {e["via"] for e in failures} == {"webhook", "command"} and len(failures) == 4, failures
    assert any("killed" in e["error"] for e in failures)
    assert any(e.get("stderr") == "nope" for e in failures)
