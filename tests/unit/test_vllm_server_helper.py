"""tests/helpers/vllm_server.py's process handling, with a stand-in for vLLM (fast, no engine):
readiness, early exit and timeout errors carry the log, and every way out kills the whole
process group (also children that ignore SIGTERM) and removes the TMPDIR."""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from tests.helpers.vllm_server import VllmServerError, pids_in_group, run_vllm_server

FAKE = textwrap.dedent(
    """\
    import http.server, os, signal, subprocess, sys, time
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    mode = os.environ.get("FAKE_MODE", "ok")
    print("fake engine argv:", " ".join(args), flush=True)
    print("fake TIKTOKEN_ENCODINGS_BASE=" + os.environ.get("TIKTOKEN_ENCODINGS_BASE", "-"), flush=True)
    print("fake REMOVED=" + os.environ.get("FAKE_REMOVED", "-"), flush=True)
    if mode == "crash":
        print("RuntimeError: boom from the fake engine", flush=True)
        sys.exit(3)
    # A child that ignores SIGTERM, like a wedged engine core (mode "polite": one that doesn't).
    if mode == "polite":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    else:
        subprocess.Popen([sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "never_ready":
        time.sleep(600)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@pytest.fixture
def fake_python(tmp_path):
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE)
    launcher = tmp_path / "fakepython"
    # Called as `fakepython -m vllm.entrypoints.openai.api_server --model ...`: drop "-m MODULE".
    launcher.write_text(f'#!/bin/sh\nshift 2\nexec {sys.executable} {script} "$@"\n')
    launcher.chmod(0o755)
    return str(launcher)


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "o200k_base.tiktoken").write_text("placeholder")  # only its presence matters here
    return d


def test_ready_then_group_and_tmpdir_gone(fake_python, model_dir, tmp_path):
    env = {"FAKE_REMOVED": None}
    os.environ["FAKE_REMOVED"] = "x"
    try:
        with run_vllm_server(
            model_dir, python=fake_python, log_dir=tmp_path / "logs", env=env, stop_grace=2
        ) as srv:
            assert srv.base_url == f"http://127.0.0.1:{srv.port}"
            assert srv.openai_base_url.endswith("/v1")
            deadline = time.monotonic() + 5
            while len(srv.group_pids()) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(srv.group_pids()) >= 2
            assert srv.rss_bytes() > 0 and srv.peak_rss_bytes() >= srv.rss_bytes() // 2
            tmpdir, pgid = srv.tmpdir, srv.pgid
            assert tmpdir.is_dir()
            log = srv.log_path.read_text()
            assert "--served-model-name gptoss" in log and "--kv-cache-memory-bytes 256M" in log
            assert "--enforce-eager" in log and "--shutdown-timeout 3" in log
            assert f"TIKTOKEN_ENCODINGS_BASE={model_dir}" in log
            assert "fake REMOVED=-" in log
            assert srv.argv[0].endswith("taskset") and srv.argv[1:3] == ["-c", "1"]
    finally:
        os.environ.pop("FAKE_REMOVED", None)
    assert not pids_in_group(pgid)
    assert not tmpdir.exists()
    assert srv.log_path.exists()  # kept for post-mortems


def test_sigterm_ignoring_engine_is_killed(fake_python, model_dir, tmp_path):
    t0 = time.monotonic()
    with run_vllm_server(
        model_dir, python=fake_python, log_dir=tmp_path, env={"FAKE_MODE": "stubborn"}, stop_grace=1
    ) as srv:
        pgid = srv.pgid
    assert not pids_in_group(pgid)
    assert srv.needed_sigkill is True and srv.stop_seconds < 15
    assert time.monotonic() - t0 < 30


def test_polite_engine_stops_on_sigterm(fake_python, model_dir, tmp_path):
    with run_vllm_server(model_dir, python=fake_python, log_dir=tmp_path, env={"FAKE_MODE": "polite"}) as srv:
        pgid = srv.pgid
    assert not pids_in_group(pgid)
    assert srv.needed_sigkill is False and srv.stop_seconds < 5


def test_early_exit_reports_log(fake_python, model_dir, tmp_path):
    with pytest.raises(VllmServerError, match=r"(?s)exited with status 3.*boom from the fake engine"):
        with run_vllm_server(model_dir, python=fake_python, log_dir=tmp_path, env={"FAKE_MODE": "crash"}):
            pytest.fail("must not yield")


def test_startup_timeout_kills_group(fake_python, model_dir, tmp_path):
    with pytest.raises(VllmServerError, match=r"(?s)not 200 within 2 s.*fake engine argv") as e:
        with run_vllm_server(
            model_dir, python=fake_python, log_dir=tmp_path, env={"FAKE_MODE": "never_ready"}, startup_timeout=2, stop_grace=1
        ):
            pytest.fail("must not yield")
    assert "fake engine argv" in str(e.value)
    logs = list(tmp_path.glob("vllm-*.log"))
    assert len(logs) == 1
    # The group is gone: no fake engine of this test remains.
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmd = open(f"/proc/{entry.name}/cmdline", "rb").read()
            except OSError:
                continue
            assert str(model_dir).encode() not in cmd


def test_exception_in_body_still_stops(fake_python, model_dir, tmp_path):
    with pytest.raises(KeyError):
        with run_vllm_server(model_dir, python=fake_python, log_dir=tmp_path, stop_grace=2) as srv:
            pgid = srv.pgid
            raise KeyError("test body failed")
    assert not pids_in_group(pgid)


def test_tiktoken_installed_when_model_dir_lacks_it(fake_python, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    with run_vllm_server(bare, python=fake_python, log_dir=tmp_path, stop_grace=2) as srv:
        base = srv.env["TIKTOKEN_ENCODINGS_BASE"]
        assert base.startswith(str(srv.tmpdir))
        assert os.path.isfile(os.path.join(base, "o200k_base.tiktoken"))
