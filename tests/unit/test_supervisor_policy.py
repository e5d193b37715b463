"""The supervisor's policy in milliseconds: the real Supervisor, settings, state machine, restart
policy and store, with an in-process engine whose life is scripted (engine_factory) and whose
/health, canary and /metrics answers come from that script (probe_factory).

What the engine is and does (a real vLLM, a real process tree, real HTTP) is tested in
tests/integration; here only the decisions: when to retry, give up, roll back, restart.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from pathlib import Path

from structlog.testing import capture_logs

from gptoss_spark.service.startup import PHASES, StartupRecord
from gptoss_spark.service.systemd import Notifier
from gptoss_spark.service.probes import EngineMetrics
from gptoss_spark.service.states import State
from gptoss_spark.base.exit_codes import EXIT_GAVE_UP, EXIT_OK
from gptoss_spark.service.supervisor import OpStatus, Supervisor
from tests.helpers.notify_socket import NotifySocket
from tests.helpers.supervisor_settings import FakeMemory, make_settings

PIDS = itertools.count(10_000)
VARIED_ERRORS = ("RuntimeError: CUDA error: an illegal memory access", "OSError: address already in use",
                 "RuntimeError: NCCL communicator was aborted")


class ScriptedEngine:
    """Stands in for EngineProcess. Its profile's FAKE_ENGINE_MODE says what it does:
    crash_on_load (exits 1 while loading; =varied: with another error line each time; =usage: exits 2,
    as vLLM does when it rejects an argument), crash_after=S (exits 1 S seconds after it first
    answers /health), crash_once (only the first engine of that profile crashes), unhealthy_after=S
    (/health fails from S seconds after start), no_tokens (/metrics shows a request that never
    progresses), bad_canary (/health 200 but the canary fails), loading_for=S (/health fails for its
    first S seconds), compiles (prints vLLM's lines of a start that loads its weights, then compiles
    an Inductor graph: the start record's phases move from weights to compile)."""

    started: list["ScriptedEngine"] = []

    def __init__(self, settings, profile):
        self.profile = profile
        env = profile.engine_env(settings)
        self.modes = dict((m.split("=", 1) + [""])[:2] for m in env.get("FAKE_ENGINE_MODE", "").split(",") if m)
        self.pid: int | None = None
        self.returncode: int | None = None
        self.stopped_with: float | None = None
        self._exit: asyncio.Future[int] | None = None
        self._born = 0.0
        self._timers: list[asyncio.TimerHandle] = []
        self._crashes = False  # crash_after armed at the first healthy answer (answered_health)
        self.started_at: float | None = None
        self.startup = StartupRecord(profile.name)  # what the supervisor reads of a start (startup.py)

    async def count_cache_additions(self) -> None:
        pass  # no kernel caches behind a scripted engine

    @property
    def base_url(self) -> str:
        return f"fake://{self.pid}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.pid, self._exit, self._born = next(PIDS), loop.create_future(), loop.time()
        self.started_at = self._born
        peers = [e for e in ScriptedEngine.started if e.profile.name == self.profile.name]
        ScriptedEngine.started.append(self)
        first = not peers
        if "compiles" in self.modes:
            self.startup.feed("Starting to load model /model ...")  # vLLM 0.32.0's lines (startup.py)
            self._timers.append(loop.call_later(0.2, self.startup.feed, "Loading weights took 0.20 seconds"))
            self._timers.append(loop.call_later(
                0.2, self.startup.feed, "Compiling a graph for compile range (1, 8) takes 2.50 s"))
        if "crash_on_load" in self.modes:
            self._timers.append(loop.call_later(0.05, self.die, 2 if self.modes["crash_on_load"] == "usage" else 1))
        self._crashes = "crash_after" in self.modes and (first or "crash_once" not in self.modes)

    def answered_health(self) -> None:
        """The first healthy answer arms crash_after, so that its crash comes after the load however slow
        the box (a timer from the start could fire while loading and make "after ready" a load crash)."""
        if self._crashes:
            self._crashes = False
            loop = asyncio.get_running_loop()
            self._timers.append(loop.call_later(float(self.modes["crash_after"]), self.die, 1))

    def die(self, code: int) -> None:
        if self._exit is not None and not self._exit.done():
            self.returncode = code
            self._exit.set_result(code)

    async def exited(self) -> int:
        return await asyncio.shield(self._exit)

    async def output_settled(self, timeout: float = 2.0) -> None:
        return None

    def exit_reason(self, when: str = "") -> str:
        line = VARIED_ERRORS[len(ScriptedEngine.started) % len(VARIED_ERRORS)] \
            if self.modes.get("crash_on_load") == "varied" else "RuntimeError: boom"
        return f"engine exited with code {self.returncode}{when}: {line}"

    async def stop(self, grace: float | None = None) -> float:
        self.stopped_with = grace if grace is not None else -1.0
        for t in self._timers:
            t.cancel()
        self.die(-15)
        return 0.0

    def age(self) -> float:
        return asyncio.get_running_loop().time() - self._born


class ScriptedProbe:
    """What the supervisor's probe sees of the ScriptedEngine at base_url."""

    def __init__(self, base_url: str, served_name: str, api_key: str | None = None):
        pid = int(base_url.rsplit("/", 1)[1])
        self.engine = next(e for e in ScriptedEngine.started if e.pid == pid)
        self.tokens = 0

    async def health(self, timeout: float) -> bool:
        e = self.engine
        if e.returncode is not None or "crash_on_load" in e.modes:
            return False
        if "loading_for" in e.modes and e.age() < float(e.modes["loading_for"]):
            return False
        healthy = not ("unhealthy_after" in e.modes and e.age() > float(e.modes["unhealthy_after"]))
        if healthy:
            e.answered_health()
        return healthy

    async def canary(self, timeout: float) -> str | None:
        return "canary completion produced no token" if "bad_canary" in self.engine.modes else None

    async def metrics(self, timeout: float) -> EngineMetrics | None:
        if "no_tokens" in self.engine.modes:
            return EngineMetrics(1, 0, 7)  # one request running, the token counter stuck
        self.tokens += 1
        return EngineMetrics(0, 0, self.tokens)


def supervisor(tmp: Path, profiles: dict[str, str], notifier: Notifier | None = None, **overrides) -> Supervisor:
    ScriptedEngine.started = []
    settings = make_settings(tmp, profiles, **{"timeouts": {"load": 2, "probe_interval": 0.05, "drain": 0.2},
                                               "wedge": {"canary_interval": 0, "stall_seconds": 0.3}, **overrides})
    # engine_args_check None: a scripted engine runs no vLLM argv to check (argcheck.py has its own tests)
    return Supervisor(settings, memory_source=FakeMemory(), engine_factory=ScriptedEngine,
                      probe_factory=ScriptedProbe, engine_args_check=None, notifier=notifier)


async def until(sup: Supervisor, task: asyncio.Task, cond, what: str, timeout: float = 10.0) -> None:
    end = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert not task.done(), f"supervisor exited ({task.result()}) before {what}: {reasons(sup)}"
        assert asyncio.get_running_loop().time() < end, f"timeout waiting for {what}: {reasons(sup)}"
        await asyncio.sleep(0.01)


def reasons(sup: Supervisor) -> list[str]:
    return [f"{t.new.value}: {t.reason}" for t in sup.sm.history]


async def stopped(sup: Supervisor, task: asyncio.Task) -> int:
    sup.request_stop()
    rc = await asyncio.wait_for(task, 10)
    assert all(e.returncode is not None for e in ScriptedEngine.started), "an engine was left running"
    return rc


def test_different_crashes_while_loading_retry_with_backoff_then_give_up(tmp_path):
    async def scenario():
        sup = supervisor(tmp_path, {"bad": "crash_on_load=varied"})
        rc = await asyncio.wait_for(sup.run(), 10)
        assert rc == EXIT_GAVE_UP
        assert len(ScriptedEngine.started) == 3                       # max_crashes = 3
        states = [t.new for t in sup.sm.history]
        assert states.count(State.BACKOFF) == 2 and states[-1] == State.FAILED
        assert "while loading" in sup.last_error and not sup.ever_ready
    asyncio.run(scenario())


def test_the_same_crash_twice_before_ready_gives_up_at_once(tmp_path):
    async def scenario():
        sup = supervisor(tmp_path, {"bad": "crash_on_load"})
        assert await asyncio.wait_for(sup.run(), 10) == EXIT_GAVE_UP
        assert len(ScriptedEngine.started) == 2                       # not max_crashes = 3
        assert sup.sm.history[-1].reason.startswith("gave up at once, the engine failed the same way twice in a row: "
                                                    "engine exited with code 1 while loading: RuntimeError: boom")
    asyncio.run(scenario())


def test_rejected_arguments_give_up_after_one_attempt(tmp_path):
    async def scenario():
        sup = supervisor(tmp_path, {"typo": "crash_on_load=usage"})
        assert await asyncio.wait_for(sup.run(), 10) == EXIT_GAVE_UP
        assert len(ScriptedEngine.started) == 1
        assert "gave up at once, the engine rejected its arguments (exit 2)" in sup.sm.history[-1].reason
        assert State.BACKOFF not in [t.new for t in sup.sm.history]
    asyncio.run(scenario())


def test_after_serving_a_hopeless_engine_stays_up_failed_until_a_switch(tmp_path):
    """Having served, the service stays up in failed (the admin API can report and switch), also when the
    failure is one retries cannot fix: here the last good profile itself now rejects its arguments."""
    async def scenario():
        sup = supervisor(tmp_path, {"good": "", "ok": ""})
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: sup.state == State.READY, "ready")
        (tmp_path / "profiles" / "good.toml").write_text(
            'description = "now broken"\nmemory_gib = 10\n[engine]\nenv = { FAKE_ENGINE_MODE = "crash_on_load=usage" }\n')
        ScriptedEngine.started[-1].die(1)  # the crash comes after the edit, however slow the box
        await until(sup, task, lambda: sup.state == State.FAILED, "failed")
        assert "rejected its arguments" in sup.sm.history[-1].reason and not task.done()
        op = sup.request_switch("ok")
        await asyncio.wait_for(op.done.wait(), 5)
        assert op.status == OpStatus.SUCCEEDED and sup.state == State.READY
        assert await stopped(sup, task) == EXIT_OK
    asyncio.run(scenario())


def test_crash_after_ready_restarts_once_and_serves_again(tmp_path):
    async def scenario():
        sup = supervisor(tmp_path, {"flaky": "crash_after=0.2,crash_once"})
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: len(ScriptedEngine.started) == 2 and sup.state == State.READY, "ready again")
        assert sup.policy.total_restarts == 1 and "engine exited with code 1" in sup.last_error
        assert await stopped(sup, task) == EXIT_OK
    asyncio.run(scenario())


def test_repeated_crashes_after_ready_stay_up_failed_until_a_switch(tmp_path):
    async def scenario():
        sup = supervisor(tmp_path, {"doomed": "crash_after=0.1", "ok": ""})
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: sup.state == State.FAILED, "failed")
        assert not task.done() and "gave up after 3 failures" in sup.sm.history[-1].reason
        op = sup.request_switch("ok")
        await asyncio.wait_for(op.done.wait(), 5)
        assert op.status == OpStatus.SUCCEEDED and sup.profile_name == "ok" and sup.state == State.READY
        assert sup.persisted().active_profile == "ok"
        assert await stopped(sup, task) == EXIT_OK
    asyncio.run(scenario())


def test_switch_to_a_profile_that_never_gets_ready_rolls_back(tmp_path):
    async def scenario():
        sup = supervisor(tmp_path, {"good": "", "broken": "crash_on_load"})
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: sup.state == State.READY, "ready")
        op = sup.request_switch("broken")
        await asyncio.wait_for(op.done.wait(), 5)
        assert op.status == OpStatus.FAILED and op.rolled_back_to == "good" and "rolled back to good" in op.error
        await until(sup, task, lambda: sup.state == State.READY and sup.profile_name == "good", "back on good")
        assert [e.profile.name for e in ScriptedEngine.started] == ["good", "broken", "good"]  # no retries of broken
        assert sup.switches == {"ok": 0, "failed": 1} and sup.persisted().last_good_profile == "good"
        assert await stopped(sup, task) == EXIT_OK
    asyncio.run(scenario())


def test_health_failing_three_times_restarts_the_engine(tmp_path):
    async def scenario():
        sup = supervisor(tmp_path, {"sick": "unhealthy_after=0.3"})
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: len(ScriptedEngine.started) >= 2, "a restart")
        assert any("/health failed 3 times in a row" in r for r in reasons(sup))
        assert await stopped(sup, task) == EXIT_OK
    asyncio.run(scenario())


def test_a_stuck_token_counter_with_a_running_request_is_a_wedge(tmp_path):
    async def scenario():
        sup = supervisor(tmp_path, {"stuck": "no_tokens"})
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: len(ScriptedEngine.started) >= 2, "a restart")
        assert any(r.startswith("stopping: wedged") for r in reasons(sup)), reasons(sup)
        assert await stopped(sup, task) == EXIT_OK
    asyncio.run(scenario())


def test_a_failing_canary_never_reports_ready(tmp_path):
    async def scenario():
        sup = supervisor(tmp_path, {"mute": "bad_canary"}, timeouts={"load": 0.5, "probe_interval": 0.05})
        rc = await asyncio.wait_for(sup.run(), 10)
        assert rc == EXIT_GAVE_UP and not sup.ever_ready
        assert "last canary error: canary completion produced no token" in sup.last_error
    asyncio.run(scenario())


def test_memory_danger_stops_the_engine_with_little_grace(tmp_path):
    async def scenario():
        sup = supervisor(tmp_path, {"big": ""})
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: sup.state == State.READY, "ready")
        sup.guard.source.available_gib = 1.0  # below danger_available_gib = 2
        await until(sup, task, lambda: ScriptedEngine.started[0].returncode is not None, "the engine stopped")
        assert ScriptedEngine.started[0].stopped_with == 2.0
        assert any("memory guard" in r for r in reasons(sup))
        sup.guard.source.available_gib = 100.0
        assert await stopped(sup, task) == EXIT_OK
    asyncio.run(scenario())


def test_a_switch_reads_the_profile_files_once_and_starts_what_was_validated(tmp_path, monkeypatch):
    """The validation's reading is the one vLLM's check and the engine get: no second read at start,
    so an edit made after the switch was accepted does not slip into that engine."""
    from gptoss_spark.service import supervisor as supervisor_module

    reads: list[int] = []
    real_load = supervisor_module.load_profiles

    def counting_load(settings):
        reads.append(1)
        return real_load(settings)

    monkeypatch.setattr(supervisor_module, "load_profiles", counting_load)

    async def scenario():
        sup = supervisor(tmp_path, {"good": "", "other": ""})  # reads once, in SupervisorParts
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: sup.state == State.READY, "ready")
        assert len(reads) == 1, "the first start uses the profiles read at construction"
        op = sup.request_switch("other")
        assert len(reads) == 2  # the validation
        # Edited before run() takes the command (no await in between): the validated one still starts.
        (tmp_path / "profiles" / "other.toml").write_text('description = "edited later"\n')
        await asyncio.wait_for(op.done.wait(), 5)
        assert op.status == OpStatus.SUCCEEDED and sup.profile_name == "other"
        assert ScriptedEngine.started[-1].profile.description == "fake other"
        assert len(reads) == 2, "nothing read the profile files again for this switch"
        assert await stopped(sup, task) == EXIT_OK
    asyncio.run(scenario())


def test_a_retry_after_a_crash_reads_the_profile_files_again(tmp_path):
    """No operation asked for the retry: it starts from the files as they are now (a fix is picked up)."""
    async def scenario():
        sup = supervisor(tmp_path, {"flaky": ""})
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: sup.state == State.READY, "ready")
        (tmp_path / "profiles" / "flaky.toml").write_text(
            'description = "fixed"\nmemory_gib = 10\n[engine]\nenv = { FAKE_ENGINE_MODE = "" }\n')
        ScriptedEngine.started[-1].die(1)  # the crash comes after the fix, however slow the box
        await until(sup, task, lambda: len(ScriptedEngine.started) == 2 and sup.state == State.READY, "ready again")
        assert ScriptedEngine.started[-1].profile.description == "fixed"
        assert await stopped(sup, task) == EXIT_OK
    asyncio.run(scenario())


def test_a_supervisor_that_gave_up_releases_its_memory_claim_and_claims_again_on_a_switch(tmp_path):
    """In failed the supervisor stays up (admin API) with no engine: its claim must not keep a second
    service on the host from starting (budget.py). A switch claims again, for the profile it starts."""
    async def scenario():
        # No memory.claims_dir: every supervisor claims, by default in <state_dir>/claims off the
        # installed layout; the file is named by the service (here its state dir), not its served name.
        sup = supervisor(tmp_path, {"doomed": "crash_after=0.1", "ok": ""})
        claim = sup.guard.budget.own_file
        assert claim.parent == sup.settings.paths.state_dir / "claims"
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: claim.exists(), "the first start's claim")
        await until(sup, task, lambda: sup.state == State.FAILED, "failed")
        assert not task.done() and not claim.exists()
        op = sup.request_switch("ok")
        await asyncio.wait_for(op.done.wait(), 5)
        assert op.status == OpStatus.SUCCEEDED and json.loads(claim.read_text())["profile"] == "ok"
        assert await stopped(sup, task) == EXIT_OK
        assert not claim.exists()  # stopped: released as well
    asyncio.run(scenario())


def test_status_names_the_start_phase_while_loading(tmp_path, monkeypatch):
    """STATUS= (what `systemctl status` shows) says where a start is: weights, then compile."""
    monkeypatch.setattr("gptoss_spark.service.supervisor.LOAD_POLL_SECONDS", 0.02)
    sock = NotifySocket(tmp_path / "n.sock")

    async def scenario():
        sup = supervisor(tmp_path, {"p": "compiles,loading_for=0.5"}, notifier=Notifier(str(tmp_path / "n.sock")))
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: sup.state == State.READY, "ready")
        assert await stopped(sup, task) == EXIT_OK

    asyncio.run(scenario())
    sock.wait_for("READY", "1", timeout=5)
    loading = [m.fields["STATUS"] for m in sock.with_field("STATUS") if m.fields["STATUS"].startswith("loading:")]
    # Besides the state machine's "loading: profile p (engine pid N)", a line at each phase it entered and
    # again every STATUS_REFRESH_SECONDS within one, saying how long the phase has run.
    phases = [m.group(1) for status in loading
              if (m := re.fullmatch(r"loading: profile p \((\w+) for \d+ s, \d+ s since spawn\)", status))]
    assert list(dict.fromkeys(phases)) == ["weights", "compile"] and set(phases) <= set(PHASES), loading


def test_status_is_sent_again_while_one_phase_runs(tmp_path, monkeypatch):
    """A phase that runs for minutes (a 120b's weights) must not leave STATUS= saying `0 s` all along."""
    monkeypatch.setattr("gptoss_spark.service.supervisor.LOAD_POLL_SECONDS", 0.02)
    monkeypatch.setattr("gptoss_spark.service.supervisor.STATUS_REFRESH_SECONDS", 0.05)
    sock = NotifySocket(tmp_path / "n.sock")

    async def scenario():
        sup = supervisor(tmp_path, {"p": "compiles,loading_for=1.0"}, notifier=Notifier(str(tmp_path / "n.sock")))
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: sup.state == State.READY, "ready")
        assert await stopped(sup, task) == EXIT_OK

    asyncio.run(scenario())
    sock.wait_for("READY", "1", timeout=5)
    compile_lines = [m.fields["STATUS"] for m in sock.with_field("STATUS") if "(compile for" in m.fields["STATUS"]]
    assert len(compile_lines) >= 2, compile_lines  # 0.8 s in compile, refreshed every 0.05 s


def test_a_start_that_compiled_warns_and_names_what(tmp_path):
    async def scenario(mode: str) -> list[dict]:
        with capture_logs() as logged:
            sup = supervisor(tmp_path, {"p": mode})
            task = asyncio.create_task(sup.run())
            await until(sup, task, lambda: sup.state == State.READY, "ready")
            assert await stopped(sup, task) == EXIT_OK
        return [e for e in logged if e["event"].startswith("engine start")]

    compiled = asyncio.run(scenario("compiles,loading_for=0.5"))
    assert len(compiled) == 1 and compiled[0]["log_level"] == "warning", compiled
    assert "inductor (1, 8) (2.5 s)" in compiled[0]["event"] and "gptoss-spark warmup" in compiled[0]["event"]
    assert compiled[0]["ready"] is True and compiled[0]["profile"] == "p"
    assert "weights=" in compiled[0]["phases"]
    warm = asyncio.run(scenario(""))  # a start that compiled nothing: no warning
    assert [(e["log_level"], e["compiled"]) for e in warm] == [("info", "nothing")]


def test_a_ready_start_that_compiled_nothing_marks_its_profile_warm(tmp_path):
    """`doctor` and `warmup --check` said "never warmed" while the service served warm: a ready start that
    compiled nothing proves the caches warm for the current key, so it writes the marker; one that compiled
    does not."""
    from gptoss_spark.service.warm_marker import marker_path, warm_state

    async def scenario(mode: str):
        sup = supervisor(tmp_path, {"p": mode})
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: sup.state == State.READY, "ready")
        assert await stopped(sup, task) == EXIT_OK
        return sup

    sup = asyncio.run(scenario("compiles,loading_for=0.5"))
    profile = sup.profiles["p"]
    assert warm_state(sup.settings, profile) == "never"  # it compiled: the caches were not warm
    sup = asyncio.run(scenario(""))  # another environment (no FAKE_ENGINE_MODE), so another key
    assert warm_state(sup.settings, sup.profiles["p"]) == "warm"
    marker = json.loads(marker_path(sup.settings, "p").read_text())
    assert marker["by"] == "service start" and marker["compiled"] == []


def test_an_engine_that_got_ready_has_its_arguments_remembered_for_the_next_check(tmp_path):
    """Once ready, the supervisor hands the profile to engine_args_started (argcheck.remember_started
    in service): the first reload after a start needs no vLLM import. Not before ready, and not at all
    where no check runs (engine_args_check None: nothing to remember for)."""
    async def scenario():
        started: list[str] = []

        async def accept(settings, profile):
            return None

        settings = make_settings(tmp_path, {"ok": "loading_for=0.3"},
                                 timeouts={"load": 2, "probe_interval": 0.05, "drain": 0.2},
                                 wedge={"canary_interval": 0, "stall_seconds": 0.3})
        ScriptedEngine.started = []
        sup = Supervisor(settings, memory_source=FakeMemory(), engine_factory=ScriptedEngine,
                         probe_factory=ScriptedProbe, engine_args_check=accept,
                         engine_args_started=lambda s, p: started.append(p.name))
        task = asyncio.create_task(sup.run())
        await until(sup, task, lambda: sup.state == State.LOADING, "loading")
        assert started == []
        await until(sup, task, lambda: sup.state == State.READY, "ready")
        assert started == ["ok"]
        assert await stopped(sup, task) == 0

        (tmp_path / "unchecked").mkdir()
        unchecked = supervisor(tmp_path / "unchecked", {"ok": ""})
        assert unchecked.engine_args_started is None
    asyncio.run(scenario())
