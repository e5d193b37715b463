"""Faults a real engine cannot show on demand, against the real supervisor and a stand-in engine.

The stand-in (tests/helpers/fake_engine.py) is a real process in its own session,
spoken to over real HTTP; only its misbehaviour is scripted. Timeouts are short
so each scenario takes seconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from gptoss_spark.service.config import Settings
from gptoss_spark.service.engine import EngineProcess, session_members
from gptoss_spark.base.exit_codes import EXIT_GAVE_UP, EXIT_OK, EXIT_REQUIREMENT
from gptoss_spark.service.supervisor import OpStatus, Supervisor
from gptoss_spark.service.states import State
from gptoss_spark.service.systemd import Notifier
from tests.helpers.notify_socket import NotifySocket
from tests.helpers.supervisor_settings import FakeMemory, make_settings

FAKE = Path(__file__).resolve().parents[1] / "helpers" / "fake_engine.py"


def fake_engine_factory(settings, profile):
    return EngineProcess(settings, profile, argv=[sys.executable, str(FAKE), "--port", str(settings.engine.port)])


class Harness:
    """Runs a Supervisor in this event loop with a recording NOTIFY_SOCKET and fake memory readings."""

    def __init__(self, tmp: Path, settings: Settings, memory: FakeMemory | None = None):
        self.notify = NotifySocket(tmp / "notify.sock")
        self.memory = memory or FakeMemory()
        self.sup = Supervisor(settings, notifier=Notifier(str(tmp / "notify.sock")), memory_source=self.memory,
                              engine_factory=fake_engine_factory, engine_args_check=None)
        self.pids: list[int] = []
        self.task: asyncio.Task[int] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.sup.run())

    async def until(self, cond, timeout: float = 20.0, what: str = "condition") -> None:
        end = asyncio.get_running_loop().time() + timeout
        while not cond():
            if self.task and self.task.done():
                raise AssertionError(f"supervisor exited ({self.task.result()}) before {what}; "
                                     f"transitions: {self.reasons()}")
            if asyncio.get_running_loop().time() > end:
                raise AssertionError(f"timeout waiting for {what}; state {self.sup.state}; {self.reasons()}")
            if self.sup.engine and self.sup.engine.pid and self.sup.engine.pid not in self.pids:
                self.pids.append(self.sup.engine.pid)
            await asyncio.sleep(0.02)

    def reasons(self) -> list[str]:
        return [f"{t.new.value}: {t.reason}" for t in self.sup.sm.history]

    def ready_reasons(self) -> list[str]:
        """Each time the state turned ready, from the history: polling can miss a ready that a crash
        ends within the poll interval, the history cannot."""
        return [t.reason for t in self.sup.sm.history if t.new == State.READY]

    async def stop(self) -> int:
        self.sup.request_stop()
        rc = await asyncio.wait_for(self.task, 20)
        self.notify.close()
        for pid in self.pids:
            assert not session_members(pid), f"engine tree {pid} left processes behind"
        return rc


def run(coro):
    return asyncio.run(coro)


def test_the_same_crash_while_loading_twice_gives_up_at_once(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"bad": "load=0.6,crash_on_load"}))
        h.start()
        rc = await asyncio.wait_for(h.task, 30)
        assert rc == EXIT_GAVE_UP
        states = [t.new for t in h.sup.sm.history]
        # The same exit twice in a row: the second is the last, not max_crashes = 3 (a third would fail alike).
        assert states.count(State.BACKOFF) == 1 and states[-1] == State.FAILED
        assert "while loading" in h.sup.last_error
        assert not h.notify.with_field("READY")                                  # never claimed ready
        assert h.notify.wait_status("failed: profile bad (gave up at once, the engine failed the same way twice "
                                    "in a row: engine exited with code 1")
        h.notify.close()
    run(scenario())


def test_vllms_alternating_wrapper_still_gives_up_after_two_failures_naming_the_root_cause(tmp_path):
    """vLLM's last line lists the failed processes as `{}` on one start, `{'EngineCore': 1}` on the
    next: the same root cause is the same failure, and the reason names the cause, not the wrapper."""
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"bad": "load=0.6,crash_on_load,vllm_init_failure"}))
        h.start()
        rc = await asyncio.wait_for(h.task, 30)
        assert rc == EXIT_GAVE_UP
        states = [t.new for t in h.sup.sm.history]
        assert states.count(State.BACKOFF) == 1 and states[-1] == State.FAILED, h.reasons()
        wrappers = [t.reason for t in h.sup.sm.history if t.new == State.STOPPING]
        assert wrappers[0].endswith("Failed core proc(s): {}") and wrappers[1].endswith("{'EngineCore': 1}")
        cause = ("engine exited with code 1 while loading: ValueError: To serve at least one request with the "
                 "model's max seq len (2048)")
        assert h.sup.sm.history[-1].reason.startswith(
            "gave up at once, the engine failed the same way twice in a row: " + cause), h.reasons()
        assert h.sup.last_error.startswith(cause) and "pid=" not in h.sup.last_error
        assert h.notify.wait_status("failed: profile bad (gave up at once, the engine failed the same way twice "
                                    "in a row: " + cause[:60])
        h.notify.close()
    run(scenario())


def test_crash_while_ready_restarts_and_recovers(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"flaky": "crash_after=0.3,crash_once"}))
        h.start()
        await h.until(lambda: len(h.ready_reasons()) == 2 and h.sup.state == State.READY, what="ready again")
        first, second = h.ready_reasons()
        assert first != second, "the same engine pid was ready twice"
        assert h.sup.policy.total_restarts == 1
        assert any("engine exited with code 1" in r for r in h.reasons())
        assert len(h.notify.with_field("READY", "1")) == 2
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_repeated_crashes_after_ready_stay_up_failed_and_a_switch_recovers(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"doomed": "crash_after=0.2", "ok": ""}))
        h.start()
        await h.until(lambda: h.sup.state == State.FAILED, timeout=40, what="failed")
        await asyncio.sleep(0.5)
        assert not h.task.done()                        # still up: the admin API can report and switch
        assert "gave up after 3 failures" in h.sup.sm.history[-1].reason
        op = h.sup.request_switch("ok")
        await asyncio.wait_for(op.done.wait(), 20)
        assert op.status == OpStatus.SUCCEEDED and h.sup.state == State.READY and h.sup.profile_name == "ok"
        assert h.sup.persisted().active_profile == "ok"
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_wedge_health_ok_but_no_tokens_is_restarted(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"wedgy": "wedge_after=1"}))
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        first = h.sup.engine.pid
        await h.until(lambda: h.sup.engine.pid != first and h.sup.state == State.READY, what="restart after wedge")
        wedge = [t.reason for t in h.sup.sm.history if t.new == State.STOPPING][0]
        assert wedge.startswith("wedged: /health answers but canary completion timed out")
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_stalled_token_counter_with_running_requests_is_a_wedge(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"stuck": "stuck_running"}))
        h.start()
        await h.until(lambda: any(t.reason.startswith("wedged: 1 request(s) running but no token")
                                  for t in h.sup.sm.history), what="stall detected")
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_sigterm_ignored_escalates_to_sigkill_of_the_whole_tree(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"stubborn": "ignore_sigterm,child"}))
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        engine = h.sup.engine
        assert len(session_members(engine.pid)) == 2       # the engine and its child
        t0 = asyncio.get_running_loop().time()
        assert await h.stop() == EXIT_OK                    # also asserts no session member remains
        took = asyncio.get_running_loop().time() - t0
        assert took >= 1.5                                  # waited the grace before SIGKILL
        assert engine.returncode == -9
        assert not engine.tmpdir.exists()                   # per-engine TMPDIR cleaned
    run(scenario())


def test_memory_guard_refusal_waits_for_memory_without_spending_the_restart_budget(tmp_path):
    """A refused first start is no crash: it waits in `starting`, says why, and starts once memory frees."""
    async def scenario():
        mem = FakeMemory(available_gib=5)                   # profile needs 10 + 1 floor
        h = Harness(tmp_path, make_settings(tmp_path, {"ok": ""}), memory=mem)
        h.start()
        await h.until(lambda: (h.sup.last_error or "").startswith("memory guard refused start"), what="refusal")
        await asyncio.sleep(1.0)                            # ten re-checks (check_interval 0.1 s)
        assert h.sup.state == State.STARTING, h.reasons()
        assert "only 5.0 GiB available" in h.sup.last_error
        assert h.sup.engine is None                         # nothing was spawned
        assert h.sup.policy.recent_failures() == 0 and h.sup.policy.total_restarts == 0
        assert any("waits for memory: only 5.0 GiB available" in m.fields["STATUS"]
                   for m in h.notify.with_field("STATUS")), h.notify.messages
        mem.available_gib = 50
        await h.until(lambda: h.sup.state == State.READY, what="ready after memory freed")
        assert [t.new for t in h.sup.sm.history] == [State.STARTING, State.LOADING, State.READY]
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_a_restart_short_of_memory_after_serving_waits_as_long_as_it_takes(tmp_path):
    """The walk-through's case: low memory for a while after the service served. Each re-check is not a
    failure (max_crashes 3 would have given up after three), the restart's operation says why it did not
    get ready, and a stop ends the wait at once."""
    async def scenario():
        mem = FakeMemory()
        h = Harness(tmp_path, make_settings(tmp_path, {"ok": ""}, memory={"start_wait": 0.2}), memory=mem)
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        mem.available_gib = 5                               # above the danger line (2), below 10 + 1
        op = h.sup.request_restart()
        await h.until(lambda: op.done.is_set(), what="the restart's operation to end")
        assert op.error.startswith("memory guard refused start: only 5.0 GiB available"), op.error
        await asyncio.sleep(1.0)                            # five times start_wait, which binds first starts only
        assert h.sup.state == State.STARTING and h.sup.engine.returncode is not None, h.reasons()
        assert h.sup.policy.recent_failures() == 0
        mem.available_gib = 50
        await h.until(lambda: h.sup.state == State.READY, what="ready after memory freed")
        mem.available_gib = 5
        h.sup.request_restart()
        await h.until(lambda: (h.sup.last_error or "").startswith("memory guard") and h.sup.state == State.STARTING
                      and h.sup.engine.returncode is not None, what="waiting again")
        assert await h.stop() == EXIT_OK                    # the stop ends the wait
    run(scenario())


def test_a_first_start_short_of_memory_gives_up_after_start_wait(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"ok": ""}, memory={"start_wait": 0.5}),
                    memory=FakeMemory(available_gib=5))
        h.start()
        assert await asyncio.wait_for(h.task, 20) == EXIT_REQUIREMENT
        assert h.sup.state == State.FAILED and h.sup.engine is None
        assert h.sup.sm.history[-1].reason.startswith("memory guard refused start for 0.5 s: only 5.0 GiB"), h.reasons()
        h.notify.close()
    run(scenario())


@pytest.mark.parametrize("reading,expect", [
    ({"available_gib": 1.5}, "MemAvailable 1.50 GiB below the danger line 2 GiB"),
    ({"psi": 75.0}, "memory pressure (PSI some avg10) 75.0% above 40%"),
])
def test_memory_guard_stops_a_running_engine_in_danger(tmp_path, reading, expect):
    async def scenario():
        mem = FakeMemory()
        h = Harness(tmp_path, make_settings(tmp_path, {"ok": ""}), memory=mem)
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        engine = h.sup.engine
        for k, v in reading.items():
            setattr(mem, k, v)
        await h.until(lambda: h.sup.state in (State.BACKOFF, State.STARTING), what="guard trip")
        assert engine.returncode is not None and not session_members(engine.pid)
        stop = [t.reason for t in h.sup.sm.history if t.new == State.STOPPING][-1]
        assert stop == f"memory guard: {expect}"
        assert h.sup.guard.trips >= 1
        mem.available_gib, mem.psi = 100, 0.0
        await h.until(lambda: h.sup.state == State.READY, what="recovered")
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_switch_to_a_profile_that_fails_rolls_back_to_last_good(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"good": "", "broken": "load=0.4,crash_on_load"}))
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        op = h.sup.request_switch("broken")
        await asyncio.wait_for(op.done.wait(), 20)
        assert op.status == OpStatus.FAILED and op.rolled_back_to == "good"
        assert "profile broken failed: engine exited with code 1 while loading" in op.error
        await h.until(lambda: h.sup.state == State.READY, what="ready on last-good")
        assert h.sup.profile_name == "good" and h.sup.persisted().active_profile == "good"
        assert h.sup.switches == {"ok": 0, "failed": 1}
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_missing_checkpoint_at_start_exits_3_without_spawning(tmp_path):
    async def scenario():
        s = make_settings(tmp_path, {"ok": ""}, model={"dir": str(tmp_path / "nowhere")})
        h = Harness(tmp_path, s)
        h.start()
        assert await asyncio.wait_for(h.task, 10) == EXIT_REQUIREMENT
        assert h.sup.engine is None and "no checkpoint at" in h.sup.last_error
        h.notify.close()
    run(scenario())


def test_hung_load_is_bounded_by_timeouts_load_and_extends_only_while_loading(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"slow": "load=600"}, timeouts={"load": 2},
                                            restart={"max_crashes": 1}))
        h.start()
        rc = await asyncio.wait_for(h.task, 30)
        assert rc == EXIT_GAVE_UP
        assert "engine not ready within timeouts.load=2 s" in h.sup.last_error
        extends = h.notify.with_field("EXTEND_TIMEOUT_USEC")
        assert extends and all(m.fields["EXTEND_TIMEOUT_USEC"] == "60000000" for m in extends)
        stopped_at = next(m.at for m in h.notify.messages
                          if m.fields.get("STATUS", "").startswith("stopping:"))
        assert all(m.at <= stopped_at for m in extends)   # no extension once loading ended
        h.notify.close()
    run(scenario())


def test_health_ok_but_canary_failing_never_reports_ready(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"mute": "wedge"}, timeouts={"load": 4},
                                            restart={"max_crashes": 1}))
        h.start()
        assert await asyncio.wait_for(h.task, 30) == EXIT_GAVE_UP
        assert "last canary error: canary completion timed out" in h.sup.last_error
        assert not h.notify.with_field("READY")
        h.notify.close()
    run(scenario())


def test_watchdog_pings_come_from_the_supervisor_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "400000")          # WatchdogSec=0.4 s -> ping every 0.2 s
    monkeypatch.setenv("WATCHDOG_PID", str(__import__("os").getpid()))

    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"ok": ""}))
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        n0 = len(h.notify.with_field("WATCHDOG", "1"))
        await asyncio.sleep(1.0)
        assert len(h.notify.with_field("WATCHDOG", "1")) - n0 >= 3
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_engine_exit_is_noticed_even_when_an_orphaned_child_holds_its_output_pipe(tmp_path):
    # kill -9 of vLLM's API server leaves its EngineCore child holding the stdout pipe; the exit
    # must be seen at once, not only after /health has failed three times.
    async def scenario():
        s = make_settings(tmp_path, {"orphan": "child,crash_after=0.3,crash_once"},
                          timeouts={"probe_interval": 5})
        h = Harness(tmp_path, s)
        h.start()
        await h.until(lambda: len(h.ready_reasons()) == 2 and h.sup.state == State.READY, what="recovered")
        first = int(h.ready_reasons()[0].split()[2])   # "engine pid N passed /health and the canary"
        stop = [t.reason for t in h.sup.sm.history if t.new == State.STOPPING][0]
        assert stop.startswith("engine exited with code 1"), stop
        assert not session_members(first)            # the orphan was swept with its session
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_kill9_leaves_ready_at_once_and_the_reason_names_the_signal(tmp_path):
    # The orphaned child holds the output pipe, as vLLM's EngineCore does after a kill -9 of
    # the API server: reading the engine's last output then takes up to 2 s, and the state must
    # not stay "ready" (what /admin/health answers) while it does.
    async def scenario():
        s = make_settings(tmp_path, {"victim": "child"}, timeouts={"probe_interval": 5},
                          wedge={"canary_interval": 0})
        h = Harness(tmp_path, s)
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        loop = asyncio.get_running_loop()
        victim = h.sup.engine.pid
        os.kill(victim, signal.SIGKILL)
        t0 = loop.time()
        await h.until(lambda: h.sup.state != State.READY, timeout=5, what="leaving ready")
        left_after = loop.time() - t0
        # Generous for a loaded box; it took over 2 s while the supervisor waited for the output.
        assert left_after < 1.0, f"still ready {left_after:.2f} s after the kill"
        await h.until(lambda: h.sup.state == State.READY and h.sup.engine.pid != victim, what="recovered")
        assert h.sup.last_error.startswith("engine killed by SIGKILL (signal 9)"), h.sup.last_error
        assert "journalctl -k" in h.sup.last_error
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_a_restart_that_cannot_get_ready_ends_systemds_reload(tmp_path):
    """RELOADING=1 keeps systemd's reload job open until READY=1: a restart whose engine fails must
    still send it (with a STATUS that says so) before its operation is seen to fail, or
    `systemctl reload` hangs until TimeoutStartSec."""
    async def scenario():
        s = make_settings(tmp_path, {"good": ""}, restart={"backoff_initial": 5, "backoff_max": 5})
        h = Harness(tmp_path, s)
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        profile = tmp_path / "profiles" / "good.toml"
        profile.write_text(profile.read_text().replace('FAKE_ENGINE_MODE = ""', 'FAKE_ENGINE_MODE = "crash_on_load"'))
        op = h.sup.request_restart()
        await asyncio.wait_for(op.done.wait(), 20)
        assert op.status == OpStatus.FAILED and "engine exited with code 1 while loading" in op.error
        assert h.sup.state == State.BACKOFF
        reloading = await asyncio.to_thread(h.notify.wait_for, "RELOADING", "1", timeout=5)
        over = await asyncio.to_thread(h.notify.wait_for, "READY", "1", after=reloading.at, timeout=5)
        assert over.fields["STATUS"].startswith("backoff: profile good (retry in 5 s: engine exited with code 1"), over
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_a_sigstopped_engine_is_killed_without_waiting_the_grace(tmp_path):
    """SIGTERM stays pending at a stopped process: the stop kills it at once instead of waiting
    shutdown_grace (60 s here; h.stop() gives up after 20)."""
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"ok": "child"}, timeouts={"shutdown_grace": 60}))
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        engine = h.sup.engine
        os.kill(engine.pid, signal.SIGSTOP)
        assert await h.stop() == EXIT_OK  # also asserts no member of its session is left
        assert engine.returncode == -signal.SIGKILL
    run(scenario())
