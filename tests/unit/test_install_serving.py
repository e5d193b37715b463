"""install/serving.py: the re-run's "does it serve?" from the supervisor's /admin/health answers."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gptoss_spark.install.serving import DOWN, ON_THE_WAY, SERVES, serving


def answer(code: int, body: dict | str):
    return lambda url, timeout: (code, (json.dumps(body) if isinstance(body, dict) else body).encode())


@pytest.mark.parametrize("code,state,expect", [
    (200, "ready", SERVES),
    (503, "failed", DOWN),      # the supervisor gave up and stays up: `systemctl is-active` says active
    (503, "backoff", DOWN),
    (503, "stopped", DOWN),
    (503, "loading", ON_THE_WAY),
    (503, "starting", ON_THE_WAY),
])
def test_the_supervisor_state_decides(code, state, expect):
    got, line = serving("http://127.0.0.1:1", get=answer(code, {"status": "x", "state": state, "profile": "demo"}))
    assert (got, line) == (expect, f"state {state}, profile demo")


def test_no_answer_or_another_server_is_down():
    got, line = serving("http://127.0.0.1:1", get=lambda url, timeout: "Connection refused")
    assert got == DOWN and line == "its admin API at http://127.0.0.1:1 does not answer (Connection refused)"
    got, line = serving("http://127.0.0.1:1", get=answer(200, "<html>"))
    assert got == DOWN and "not the supervisor's health" in line


def test_over_http_against_a_real_socket():
    """The default getter, a 503 included (urllib raises it as HTTPError)."""
    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"status": "unavailable", "state": "failed", "profile": "plain"}).encode()
            self.send_response(503 if self.path == "/admin/health" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        assert serving(f"http://127.0.0.1:{srv.server_port}") == (DOWN, "state failed, profile plain")
    finally:
        srv.shutdown()
        srv.server_close()
