"""`gptoss-spark status | profile | restart` against a real admin server (a supervisor that is not running)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import threading
from pathlib import Path

import pytest

from gptoss_spark import cli
from gptoss_spark.admin import run_admin_server
from gptoss_spark.admin_cli import render_status
from gptoss_spark.service.config import Settings
from gptoss_spark.service.memory import GIB, MemoryReading
from gptoss_spark.service.store import PersistedState
from gptoss_spark.service.states import State
from gptoss_spark.service.supervisor import Supervisor

TOKEN = "cli-token-" + "b" * 32


class PlentyOfMemory:
    def read(self) -> MemoryReading:
        return MemoryReading(available_bytes=100 * GIB, total_bytes=128 * GIB, psi_some_avg10=1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """The admin server in its own event loop on a thread, like the supervisor process runs it."""

    def __init__(self, settings: Settings):
        self.loop = asyncio.new_event_loop()
        self.sup: Supervisor | None = None
        self.settings = settings
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(20)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.sup = Supervisor(self.settings, memory_source=PlentyOfMemory())
        self.task = self.loop.create_task(run_admin_server(self.sup, self.settings))
        self.loop.call_soon(self._wait_listening)
        self.loop.run_forever()

    def _wait_listening(self) -> None:
        try:
            socket.create_connection(("127.0.0.1", self.settings.admin.port), timeout=0.2).close()
            self.ready.set()
        except OSError:
            self.loop.call_later(0.05, self._wait_listening)

    def do(self, fn):
        """Run fn() in the service's loop (the supervisor is not thread-safe) and return its result."""
        async def wrapper():
            return fn()
        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.loop.call_soon_threadsafe(lambda: self.loop.call_later(0.5, self.loop.stop))
        self.thread.join(20)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "demo.toml").write_text('description = "the demo"\n')
    (profiles / "demo-b.toml").write_text('description = "the other demo"\n')
    (tmp_path / "admin.token").write_text(TOKEN + "\n")
    cfg = tmp_path / "gptoss-spark.toml"
    cfg.write_text(f"""
default_profile = "demo"
[model]
dir = "{model}"
[admin]
port = {free_port()}
token_file = "{tmp_path / 'admin.token'}"
[paths]
state_dir = "{tmp_path / 'state'}"
profile_dirs = ["{profiles}"]
[timeouts]
load = 5
drain = 1
shutdown_grace = 1
""")
    return cfg


@pytest.fixture
def service(config: Path):
    from structlog.testing import capture_logs

    from gptoss_spark.service.config import load_settings
    with capture_logs():  # keep the service's log lines out of the CLI's captured stdout
        svc = Service(load_settings(config))
        yield svc
        svc.close()


def make_ready(sup: Supervisor, name: str = "demo") -> None:
    sup.profile_name = name
    for s in (State.STARTING, State.LOADING, State.READY):
        sup.sm.to(s, "test", name)
    sup.store.save(PersistedState(active_profile=name, last_good_profile=name))


def test_status_human_and_json_exit_code_follows_readiness(service, config, capsys):
    assert cli.main(["status", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("state      stopped")
    service.do(lambda: make_ready(service.sup))
    assert cli.main(["status", "--config", str(config), "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["state"] == "ready" and snap["profile"] == "demo"


def test_profile_lists_and_marks_the_active_one(service, config, capsys):
    service.do(lambda: make_ready(service.sup))
    assert cli.main(["profile", "--config", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "active: demo (ready); last good: demo"
    assert out[1].split() == ["*", "demo", "the", "demo"]
    assert out[2].split()[0] == "demo-b"


def test_a_profile_file_added_while_running_is_listed_without_a_reload(service, config, capsys):
    service.do(lambda: make_ready(service.sup))
    profiles = config.parent / "profiles"
    (profiles / "demo-c.toml").write_text('description = "added while running"\n')
    assert cli.main(["profile", "--config", str(config)]) == 0
    assert [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:]] == ["*", "demo-b", "demo-c"]
    (profiles / "broken.toml").write_text("description = \n")
    assert cli.main(["profile", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "a profile file is broken (listed: the profiles loaded before): " in out and "broken.toml" in out, out


def test_a_profile_file_added_while_running_can_be_switched_to_without_a_reload(service, config, capsys):
    """The switch reads the profile directories afresh too: a file added after the start is the
    target, with what it says (not "unknown profile")."""
    service.do(lambda: make_ready(service.sup))
    (config.parent / "profiles" / "demo-c.toml").write_text('description = "added while running"\n')
    assert cli.main(["profile", "demo-c", "--no-wait", "--config", str(config)]) == 0
    assert "switching demo -> demo-c" in capsys.readouterr().out
    pending = service.do(lambda: service.sup.commands.pending)
    assert pending is not None and pending.op.target == "demo-c"
    target = pending.profile or service.do(lambda: service.sup.profiles.get("demo-c"))
    assert target is not None and target.description == "added while running"


def test_profile_switch_no_wait_queues_it(service, config, capsys):
    service.do(lambda: make_ready(service.sup))
    assert cli.main(["profile", "demo-b", "--no-wait", "--config", str(config)]) == 0
    assert "switching demo -> demo-b" in capsys.readouterr().out
    pending = service.do(lambda: service.sup.commands.pending)
    assert pending is not None and pending.op.target == "demo-b"


def test_profile_switch_waits_and_reports_a_failure_with_its_rollback(service, config, capsys):
    service.do(lambda: make_ready(service.sup))

    def fail_it_when_queued():
        async def go():
            while service.sup.commands.pending is None:
                await asyncio.sleep(0.02)
            op = service.sup.commands.pending.op
            op.rolled_back_to = "demo"
            sm = service.sup.sm
            sm.to(State.DRAINING, "test", "demo-b")
            sm.to(State.STOPPING, "test", "demo-b")
            sm.to(State.STARTING, "rollback", "demo")
            op.finish(False, "profile demo-b failed: engine exited with code 2; rolled back to demo")
            await asyncio.sleep(1.5)  # the rollback's engine loads; the CLI keeps waiting for it
            sm.to(State.LOADING, "test", "demo")
            sm.to(State.READY, "test", "demo")
        return asyncio.ensure_future(go())

    service.do(fail_it_when_queued)
    assert cli.main(["profile", "demo-b", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "switch to demo-b FAILED: profile demo-b failed: engine exited with code 2" in err
    assert "rolled back to demo: it is starting again" in err
    assert re.search(r"^demo serves again, \d+ s after the switch began$", err, re.M), err


def test_a_switch_refused_before_it_stops_anything_shows_no_state_of_the_old_engine(service, config, capsys):
    """A switch refused at once (vLLM's argument check) never leaves `ready`: the progress must not
    open with the old engine's `ready` just before FAILED."""
    service.do(lambda: make_ready(service.sup))

    def refuse_it_later():
        async def go():
            while service.sup.commands.pending is None:
                await asyncio.sleep(0.02)
            await asyncio.sleep(2.5)  # the CLI polls the health (still the old engine's ready) meanwhile
            service.sup.commands.pending.op.finish(False, "vLLM rejects profile demo-b's engine arguments")
        return asyncio.ensure_future(go())

    service.do(refuse_it_later)
    assert cli.main(["profile", "demo-b", "--config", str(config)]) == 1
    out, err = capsys.readouterr()
    assert "switch to demo-b FAILED: vLLM rejects" in err
    assert "ready" not in out.split("operation", 1)[-1], out


def test_switch_to_the_active_profile_is_a_noop(service, config, capsys):
    service.do(lambda: make_ready(service.sup))
    assert cli.main(["profile", "demo", "--config", str(config)]) == 0
    assert "already active" in capsys.readouterr().out


def test_unknown_profile_is_one_line_and_nonzero(service, config, capsys):
    service.do(lambda: make_ready(service.sup))
    assert cli.main(["profile", "nosuch", "--config", str(config)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown profile 'nosuch'" in err[0]


def test_missing_token_file_is_a_clear_error(service, config, capsys, tmp_path):
    (tmp_path / "admin.token").unlink()
    assert cli.main(["restart", "--config", str(config)]) == 77
    assert "admin token file" in capsys.readouterr().err


def test_wrong_token_is_reported_as_refused(service, config, capsys, tmp_path):
    service.do(lambda: make_ready(service.sup))
    (tmp_path / "other.token").write_text("z" * 40)
    other = tmp_path / "other.toml"
    other.write_text(config.read_text().replace(str(tmp_path / "admin.token"), str(tmp_path / "other.token")))
    assert cli.main(["restart", "--config", str(other)]) == 77
    err = capsys.readouterr().err
    assert "refused the token" in err and "z" * 40 not in err


def test_service_down_is_a_clear_error(config, capsys):
    assert cli.main(["status", "--config", str(config)]) == 69
    assert "not answering at http://127.0.0.1:" in capsys.readouterr().err


def test_render_status_shows_the_last_error_and_transitions():
    text = render_status({
        "state": "backoff", "profile": "demo", "engine_pid": None, "uptime_seconds": 3725,
        "restarts": 2, "recent_failures": 2, "last_error": "engine exited with code 1",
        "switches": {"ok": 1, "failed": 0}, "saved": {"last_good_profile": "demo"},
        "transitions": [{"at": 0, "from": "ready", "to": "stopping", "reason": "crash", "profile": "demo"}],
    })
    assert "last error engine exited with code 1" in text
    assert "uptime     1h2m5s" in text
    assert "ready -> stopping" in text


def test_restart_with_the_admin_api_down_falls_back_to_sighup(config, capsys, tmp_path):
    """The unit's ExecReload: with the API not answering, the supervisor (here a child that
    records its SIGHUP) still gets the reload, by the signal."""
    import subprocess

    marker = tmp_path / "got-hup"
    child = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGHUP, lambda *a: (open({str(marker)!r}, 'w').write('hup'), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        assert cli.main(["restart", "--config", str(config), "--signal-if-down", str(child.pid)]) == 0
        assert child.wait(timeout=30) == 0 and marker.read_text() == "hup"
    finally:
        child.kill()
        child.wait()
    err = capsys.readouterr().err
    assert "not answering at http://127.0.0.1:" in err and f"sent SIGHUP to {child.pid} instead" in err
    # Without the option the same call is the one-line error it always was.
    assert cli.main(["restart", "--config", str(config)]) == 69


def telemetry_status(devices, unavailable=None, alert_after=10.0):
    """/admin/status's `telemetry` as the supervisor publishes it: a sampler's snapshot through JSON,
    after 30 s of the same reading (so a sustained throttle is an episode)."""
    from gptoss_spark.service.gpu import GpuReading
    from gptoss_spark.service.hostmem import HostMemory
    from gptoss_spark.service.probes import GENERATED, RUNNING
    from gptoss_spark.service.telemetry import SampleContext, TelemetrySampler
    from gptoss_spark.service.throttle import ThrottleWatch

    t = [1000.0]
    sampler = TelemetrySampler(5.0, memory_source=None, watch=ThrottleWatch(alert_after, 0.5, clock=lambda: t[0]),
                               wall=lambda: t[0])
    reading = GpuReading(tuple(devices), unavailable=unavailable, driver_version="580.95.05")
    for i in range(7):
        t[0] += 5
        sampler.record(SampleContext("ready", "demo", 42, "x"), reading,
                       HostMemory(5 << 30, 8 << 30, 0.5, 3 << 30, "/x", 2 << 30), {RUNNING: 1.0, GENERATED: 100.0 * i})
    return json.loads(json.dumps(sampler.latest.to_json()))


def gpu(index, throttle=(), sm=2418.0, temp=71.0):
    from gptoss_spark.service.gpu import GpuDevice

    return GpuDevice(index=index, name="NVIDIA GB10", temperature_c=temp, sm_clock_mhz=sm, memory_clock_mhz=4266.0,
                     max_sm_clock_mhz=3003.0, power_watts=95.5, power_limit_watts=140.0, utilization_percent=87.0,
                     throttle=frozenset(throttle), memory_used_bytes=None, memory_total_bytes=None,
                     engine_memory_bytes=None)


def rows_of(text: str) -> dict[str, str]:
    return {line[:11].strip(): line[11:] for line in text.splitlines() if not line.startswith(" ")}


def test_status_shows_one_row_per_gpu_and_the_throttle_episodes_going_on():
    tel = telemetry_status([gpu(0, {"sw_thermal", "idle"}, temp=93.0), gpu(1, sm=900.0)])
    rows = rows_of(render_status({"state": "ready", "profile": "demo", "telemetry": tel}))
    # `idle` is no slowdown: not shown.
    assert rows["gpu 0"] == "93 C, SM 2418 MHz of 3003, 96 W of 140 W, util 87%, throttle: sw_thermal"
    assert rows["gpu 1"] == "71 C, SM 900 MHz of 3003, 96 W of 140 W, util 87%"
    # GPU 0 thermal for 30 s; GPU 1 at 30% of its maximum while a request runs: both episodes.
    assert rows["throttling"] == "low_clock (gpu 1), thermal (gpu 0)"
    assert rows["engine mem"] == "unit cgroup 3.0 GiB, engine RSS 2.0 GiB, 20.0 tokens/s"
    assert "gpu" not in rows  # the devices speak for themselves


def test_status_without_nvml_or_a_sample_says_why_and_shows_no_throttling_row():
    rows = rows_of(render_status({"state": "ready", "telemetry": telemetry_status(
        [], unavailable="no NVML: NVML Shared Library Not Found")}))
    assert rows["gpu"] == "no NVML: NVML Shared Library Not Found"
    assert "throttling" not in rows and not any(k.startswith("gpu ") for k in rows)
    assert rows_of(render_status({"state": "stopped", "telemetry": None}))["gpu"] == "no sample yet"
    quiet = rows_of(render_status({"state": "ready", "telemetry": telemetry_status([gpu(0)])}))
    assert "throttling" not in quiet and quiet["gpu 0"].startswith("71 C, ")
