"""Engine argv/env building, sd_notify plumbing and memory readings: pure logic, no engine."""

from __future__ import annotations

import os
from pathlib import Path

from gptoss_spark.service.config import Settings
from gptoss_spark.service.engine import build_argv, build_env, engine_shutdown_timeout
from gptoss_spark.service.memory import GIB, MemoryGuard, MemoryReading, ProcMemorySource
from gptoss_spark.service.config import MemorySettings
from gptoss_spark.service.probes import parse_prometheus_sums
from gptoss_spark.service.profiles import Profile
from gptoss_spark.service.systemd import Notifier, watchdog_interval
from tests.helpers.notify_socket import NotifySocket


def profile(**kw) -> Profile:
    base = dict(name="p", source=Path("/x/p.toml"), description="d", memory_gib=1, args=("--max-num-seqs", "4"),
                env={"A": "{model_dir}"})
    base.update(kw)
    return Profile(**base)


def test_argv_owns_model_host_port_and_bounds_shutdown(tmp_path):
    s = Settings.model_validate({"model": {"dir": str(tmp_path)}, "engine": {"port": 9000},
                                 "timeouts": {"shutdown_grace": 15}})
    argv = build_argv(s, profile())
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == str(tmp_path)
    assert argv[argv.index("--port") + 1] == "9000"
    assert argv[argv.index("--shutdown-timeout") + 1] == "7" == str(engine_shutdown_timeout(s))
    assert argv[-2:] == ["--max-num-seqs", "4"]
    s2 = s.model_copy(update={"engine": s.engine.model_copy(update={"cpu_affinity": [0, 1]})})
    assert build_argv(s2, profile())[:3] == ["taskset", "-c", "0,1"]


def test_env_strips_supervisor_only_vars_and_keeps_secrets_out_of_argv(tmp_path):
    key = tmp_path / "api.key"
    key.write_text("s3cret\n")
    s = Settings.model_validate({"model": {"dir": str(tmp_path), "tiktoken_dir": str(tmp_path)},
                                 "engine": {"api_key_file": str(key)},
                                 "paths": {"state_dir": str(tmp_path / "st")}})
    base = {"PATH": "/bin", "NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1"}
    env = build_env(s, profile(), tmp_path / "tmp", base=base)
    assert "NOTIFY_SOCKET" not in env and "WATCHDOG_USEC" not in env and "WATCHDOG_PID" not in env
    assert env["TMPDIR"] == str(tmp_path / "tmp")
    assert env["VLLM_API_KEY"] == "s3cret"
    assert env["TIKTOKEN_ENCODINGS_BASE"] == str(tmp_path)
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "st" / "cache" / "triton")
    assert env["A"] == str(tmp_path)          # profile env, placeholder filled
    assert not any("s3cret" in a for a in build_argv(s, profile()))


def test_notifier_sends_to_its_socket_and_removes_it_from_environ(tmp_path, monkeypatch):
    sock = NotifySocket(tmp_path / "n.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "n.sock"))
    n = Notifier()
    assert "NOTIFY_SOCKET" not in os.environ
    n.extend_timeout(60)
    n.ready("ready: profile plain")
    n.reloading("switch")
    msg = sock.wait_for("READY", "1", timeout=5)
    assert msg.fields["STATUS"] == "ready: profile plain"
    assert sock.wait_for("EXTEND_TIMEOUT_USEC", "60000000", timeout=5)
    assert "MONOTONIC_USEC" in sock.wait_for("RELOADING", "1", timeout=5).fields
    sock.close()


def test_a_start_in_progress_extends_systemds_job_at_most_every_interval():
    """Each poll of a start calls progress(); systemd hears EXTEND_TIMEOUT_USEC once per interval,
    not once per poll (the load loop polls every second)."""
    from gptoss_spark.service.systemd import EXTEND_BY_SECONDS, EXTEND_EVERY_SECONDS, StartJobKeeper

    class Recorder:
        def __init__(self):
            self.extended: list[float] = []

        def extend_timeout(self, seconds: float) -> None:
            self.extended.append(seconds)

    now = [100.0]
    rec = Recorder()
    keeper = StartJobKeeper(rec, lambda: now[0])
    for _ in range(int(3 * EXTEND_EVERY_SECONDS)):  # one poll a second for three intervals
        keeper.progress()
        now[0] += 1.0
    assert rec.extended == [EXTEND_BY_SECONDS] * 3


def test_notifier_without_socket_is_silent(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    n = Notifier()
    assert not n.enabled
    n.ready("x")   # no error, nothing to send to


def test_watchdog_interval(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "60000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 30
    monkeypatch.setenv("WATCHDOG_PID", "1")          # meant for another process
    assert watchdog_interval() is None
    monkeypatch.delenv("WATCHDOG_USEC")
    assert watchdog_interval() is None


def test_proc_memory_source_parses_meminfo_and_psi(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal:       131072000 kB\nMemFree:  1 kB\nMemAvailable:    8388608 kB\n")
    (tmp_path / "pressure").mkdir()
    (tmp_path / "pressure" / "memory").write_text(
        "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=1\n")
    r = ProcMemorySource(tmp_path).read()
    assert r.available_gib == 8.0 and r.total_bytes == 131072000 * 1024 and r.psi_some_avg10 == 12.5
    (tmp_path / "pressure" / "memory").unlink()
    assert ProcMemorySource(tmp_path).read().psi_some_avg10 is None   # kernel without PSI


class Fixed:
    def __init__(self, gib, psi=None):
        self.r = MemoryReading(int(gib * GIB), 128 * GIB, psi)

    def read(self):
        return self.r


def test_memory_guard_thresholds():
    s = MemorySettings(start_floor_gib=4, danger_available_gib=2, danger_psi_some_avg10=40)
    assert MemoryGuard(s, Fixed(90)).start_refusal(84) is None
    assert "only 87.0 GiB available, the profile needs 84 GiB + 4 GiB floor" in MemoryGuard(s, Fixed(87)).start_refusal(84)
    g = MemoryGuard(s, Fixed(2.5, psi=39.9))
    assert g.danger() is None and g.trips == 0
    g = MemoryGuard(s, Fixed(1.9))
    assert "below the danger line" in g.danger() and g.trips == 1
    assert "memory pressure" in MemoryGuard(s, Fixed(50, psi=41)).danger()


def test_prometheus_sums_over_labels():
    text = ('# HELP x\nvllm:num_requests_running{model_name="a",engine="0"} 2.0\n'
            'vllm:num_requests_running{model_name="a",engine="1"} 1.0\n'
            'vllm:generation_tokens_total{model_name="a"} 1.5e3\nvllm:num_requests_waiting 4\n'
            'vllm:num_requests_running_other 99\n')
    sums = parse_prometheus_sums(text, ("vllm:num_requests_running", "vllm:generation_tokens_total",
                                        "vllm:num_requests_waiting"))
    assert sums == {"vllm:num_requests_running": 3.0, "vllm:generation_tokens_total": 1500.0,
                    "vllm:num_requests_waiting": 4.0}


def test_what_the_engine_logs_after_a_stop_we_asked_for_is_not_an_error(tmp_path):
    """A process that, like vLLM, logs an ERROR traceback and nanobind's leak lines when told to stop:
    after our SIGTERM those lines are info; the same lines before any stop keep their level."""
    import asyncio
    import sys

    from structlog.testing import capture_logs

    from gptoss_spark.service.engine import EngineProcess

    script = ("import signal, sys, time\n"
              "def bye(*_):\n"
              "    print('ERROR 12-03 10:00:00 [async_llm.py:1] AsyncLLM output_handler failed.', flush=True)\n"
              "    print('vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.', flush=True)\n"
              "    print('nanobind: leaked 3 instances!', flush=True)\n"
              "    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye)\n"
              "print('(APIServer pid=7) INFO 12-03 09:59:58 [launcher.py:46] Route: /health, Methods: GET', "
              "flush=True)\n"
              "print('ERROR 12-03 09:59:59 [x.py:1] a real error while serving', flush=True)\n"
              "time.sleep(60)\n")
    s = Settings.model_validate({"model": {"dir": str(tmp_path)}, "paths": {"state_dir": str(tmp_path / "state")},
                                 "timeouts": {"shutdown_grace": 10}})

    async def scenario():
        engine = EngineProcess(s, profile(), argv=[sys.executable, "-c", script], env=dict(os.environ))
        await engine.start()
        for _ in range(200):
            if engine.tail:
                break
            await asyncio.sleep(0.05)
        await engine.stop()
        await engine.output_settled()
        return list(engine.tail)

    with capture_logs() as logs:
        tail = asyncio.run(scenario())
    levels = {e["event"]: e["log_level"] for e in logs if e.get("pid") and "event" in e}
    assert levels["ERROR 12-03 09:59:59 [x.py:1] a real error while serving"] == "error"
    assert levels["ERROR 12-03 10:00:00 [async_llm.py:1] AsyncLLM output_handler failed."] == "info"
    # Noise for an owner (logs.engine_noise): below the journal's info, and out of the exit reason's tail.
    assert levels["nanobind: leaked 3 instances!"] == "debug"
    assert levels["(APIServer pid=7) INFO 12-03 09:59:58 [launcher.py:46] Route: /health, Methods: GET"] == "debug"
    assert not [line for line in tail if "nanobind" in line or "Route:" in line], tail
    assert "ERROR 12-03 09:59:59 [x.py:1] a real error while serving" in tail
