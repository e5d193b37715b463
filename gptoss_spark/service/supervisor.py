"""The supervisor: owns the engine's life, tells systemd the truth about it.

One asyncio task (run) walks the state machine of states.py:

    starting -> loading -> ready -> draining -> stopping -> stopped
                                   \\-> (crash, wedge, memory) stopping -> backoff -> starting ...
                                                                      \\-> failed (gave up)

Requests from outside (SIGHUP, SIGTERM, the admin API) never touch the engine:
they are validated here, queued as a Command (operations.py) and carried out by
run() at the next safe point, and their progress is visible as an Operation.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping

import structlog

from .alerts import Alerter
from .argcheck import ArgCheckUnavailable, profile_rejects, remember_started
from .config import Settings
from .api_access import read_api_key
from .engine import EngineProcess
from ..base.errors import ConfigError, RequirementError
from ..base.exit_codes import EXIT_OK, EXIT_REQUIREMENT
from .budget import MemoryBudget
from .instance import service_name
from .memory import MemoryGuard, MemorySource, ProcMemorySource
from .probes import EngineProbe
from .startup import StartupHistory
from . import warm_marker
from .profiles import Profile, load_profiles, unknown_profiles
from .operations import Command, CommandQueue, Operation, Rejected
from .status import (CommandKind, Counters, EngineStatus, GuardStatus,
                     OpStatus, StartStatus, SupervisorStatus, frozen_map)
from .roles import Interrupted, NotStarted, role_for
from .store import PersistedState, StateStore
from .states import Failure, Next, RestartPolicy, StallDetector, State, StateMachine, Transition, after_failure
from .systemd import Notifier, StartJobKeeper, watchdog_interval
from .telemetry import SampleContext, TelemetrySampler
from .throttle import ThrottleWatch

log = structlog.get_logger("gptoss_spark.service.supervisor")

# `gptoss-spark serve` exits EXIT_OK, EXIT_USAGE (bad settings or profile file), EXIT_REQUIREMENT
# or EXIT_GAVE_UP; the unit's RestartPreventExitStatus lists the last three (states.after_failure decides).

LOAD_POLL_SECONDS = 1.0
STATUS_REFRESH_SECONDS = 5.0  # how often STATUS= says again how long a start's phase has run
HEALTH_FAILURES_BEFORE_RESTART = 3
# _serve's reasons for restarting an engine that is alive but not serving (alerts: "wedged").
WEDGE_REASONS = ("wedged: ", "engine /health failed")


@dataclass
class _Ended:
    """Why an engine generation ended. command set = asked for; else a failure with reason."""

    reason: str
    command: Command | None = None
    reached_ready: bool = False
    requirement: bool = False
    exit_code: int | None = None  # set when the engine process itself ended


@dataclass(frozen=True)
class SupervisorParts:
    """What the supervisor works with, built from the settings by `serve` (commands.py) and passed in:
    the persisted store, the memory guard, the restart policy and the profiles loaded at start."""

    store: StateStore
    guard: MemoryGuard
    policy: RestartPolicy
    profiles: Mapping[str, Profile]

    @classmethod
    def from_settings(cls, settings: Settings, *, memory_source: MemorySource | None = None,
                      clock: Callable[[], float] = time.monotonic) -> "SupervisorParts":
        """ConfigError if a profile file is invalid: `serve` exits before anything starts."""
        return cls(store=StateStore(settings.state_file),
                   guard=MemoryGuard(settings.memory, memory_source or ProcMemorySource(),
                                     MemoryBudget(settings.claims_dir, service_name(settings.paths.state_dir))),
                   policy=RestartPolicy(settings.restart, clock),
                   profiles=load_profiles(settings))


class Supervisor:
    def __init__(self, settings: Settings, parts: SupervisorParts | None = None, *,
                 notifier: Notifier | None = None, memory_source: MemorySource | None = None,
                 engine_factory: Callable[[Settings, Profile], EngineProcess] = EngineProcess,
                 probe_factory: Callable[[str, str, str | None], EngineProbe] = EngineProbe,
                 engine_args_check: Callable[[Settings, Profile], Awaitable[str | None]] | None = profile_rejects,
                 engine_args_started: Callable[[Settings, Profile], None] | None = remember_started,
                 clock: Callable[[], float] = time.monotonic):
        """parts: as `serve` builds them; without, built here from settings (memory_source: where the
        guard reads memory, a stand-in in tests; only without parts, whose guard has its own)."""
        if parts is None:
            parts = SupervisorParts.from_settings(settings, memory_source=memory_source, clock=clock)
        elif memory_source is not None:
            raise TypeError("memory_source is for a Supervisor that builds its own parts; put it in parts.guard")
        self.settings = settings
        self.store = parts.store
        self.guard = parts.guard
        self.alerts = Alerter(settings.alerts)
        self.engine_factory = engine_factory
        self.probe_factory = probe_factory  # (base_url, served_name, api_key) -> what /health etc. answer
        self.notifier = notifier or Notifier(socket_path="")
        # Requests from outside wait here for run()'s next safe point (operations.py).
        self.commands = CommandQueue()
        # Solo, or the head or worker of two nodes (roles.py): where the two-node protocol differs.
        self.role = role_for(settings, self.commands, self.notifier, clock)
        # vLLM's parser on a target's argv before a switch/restart (argcheck.py); None for a stand-in
        # engine (tests), which runs no vLLM argv, and on a worker, whose argv is the head's business.
        self.engine_args_check = engine_args_check if self.role.checks_engine_args else None
        # An engine that got ready proves its argv: remembered for that check (argcheck.remember_started).
        self.engine_args_started = engine_args_started if self.engine_args_check is not None else None
        self.clock = clock
        self.sm = StateMachine(clock)
        self.sm.subscribe(self._on_transition)
        self.policy = parts.policy
        # The loaded set: re-read when a switch or restart is validated, and when the engine is
        # started again without one (a retry after a failure, a rollback, a worker's order).
        self.profiles: dict[str, Profile] = dict(parts.profiles)
        self.profile_name: str | None = None
        self.engine: EngineProcess | None = None
        self.engine_ready_since: float | None = None
        self.started_at = time.time()
        self.ever_ready = False
        self.last_error: str | None = None
        self.switches = {"ok": 0, "failed": 0}
        # Every engine start's phases and compiles (startup.py): status, /metrics, the journal.
        self.starts = StartupHistory()
        self._load_phase_shown: str | None = None
        # GPU, memory and throughput figures, sampled off the loop (telemetry.py); read by status().
        gpu = settings.gpu
        self.telemetry = TelemetrySampler(
            gpu.sample_interval, self.guard.source,
            ThrottleWatch(gpu.alert_after_seconds, gpu.low_clock_fraction, gpu.max_clock_mhz, clock,
                          power_clock_fraction=gpu.power_clock_fraction, alerts=gpu.alerts),
            self.alerts, probe_timeout=settings.timeouts.probe_timeout)

    # ---- views for the admin API and CLI --------------------------------------------------

    @property
    def state(self) -> State:
        return self.sm.state

    def status(self) -> SupervisorStatus:
        """Everything the admin API, /metrics and the CLI show, taken at one instant (status.py)."""
        engine = self.engine
        alive = engine is not None and engine.returncode is None
        ready = self.state == State.READY
        mem = self.guard.last
        # Before the guard's first reading (only while starting up) the host's total is read here.
        total = mem.total_bytes if mem is not None else self.guard.source.read().total_bytes
        return SupervisorStatus(
            state=self.state,
            profile=self.profile_name,
            engine=EngineStatus(
                pid=engine.pid if alive else None,
                url=engine.base_url if engine else None,
                ready_seconds=round(self.clock() - self.engine_ready_since, 1)
                if self.engine_ready_since is not None and ready else None),
            started_at=self.started_at,
            uptime_seconds=round(time.time() - self.started_at, 1),
            last_error=self.last_error,
            counters=Counters(restarts=self.policy.total_restarts, recent_failures=self.policy.recent_failures(),
                              switches_ok=self.switches.get("ok", 0), switches_failed=self.switches.get("failed", 0)),
            guard=GuardStatus(reading=mem, trips=self.guard.trips, host_total_bytes=total),
            operation=self.commands.current.view() if self.commands.current else None,
            operations=frozen_map(self.commands.views()),
            transitions=tuple(self.sm.history),
            state_seconds=frozen_map(self.sm.seconds_in()),
            profiles=frozen_map(self.profiles),
            saved=self.store.current(),
            cluster=self.role.status(self.state, self.profile_name, engine, self.last_error),
            start=StartStatus(current=self._start_in_progress(), last=self.starts.last.to_json()
                              if self.starts.last else None, histograms=self.starts.histograms_view()),
            telemetry=self.telemetry.latest,
        )

    def _start_in_progress(self) -> dict | None:
        engine = self.engine
        if engine is None or self.state not in (State.STARTING, State.LOADING) or engine.started_at is None:
            return None
        rec = engine.startup
        return {"phase": rec.current_phase(), "seconds": round(time.monotonic() - rec.spawned_at, 1),
                "phases": rec.phases()}

    @property
    def operations(self) -> Mapping[str, Operation]:
        """The recent operations by id (the last operations.OPERATIONS_KEPT)."""
        return self.commands.operations

    def persisted(self) -> PersistedState:
        return self.store.load()

    # ---- requests from outside --------------------------------------------------------------

    def request_stop(self) -> None:
        self.notifier.stopping(f"stopping: draining up to {self.settings.timeouts.drain:g} s")
        self.commands.put(Command(CommandKind.STOP))

    def request_restart(self) -> Operation:
        """Warm restart: engine only, same profile, caches kept. Validated first: a broken profile edit
        is reported here instead of taking down a serving engine."""
        self.role.refuse_request("restart")
        self.commands.ensure_idle()
        if self.profile_name is None:
            raise Rejected("state", "the engine has not been started yet")
        profile = self._validated_profile(self.profile_name)
        op = self.commands.new_operation(CommandKind.RESTART, profile.name, self.profile_name)
        self.commands.put(Command(CommandKind.RESTART, op, profile))
        return op

    def request_switch(self, name: str) -> Operation | None:
        """Validate a switch to profile `name` and queue it. None = already active and ready (no-op)."""
        self.role.refuse_request("switch")
        self.commands.ensure_idle()
        profile = self._validated_profile(name)
        if name == self.profile_name and self.state == State.READY:
            return None
        current = self.profiles.get(self.profile_name or "")
        # The current engine's memory comes back when it stops: count it as available.
        freed = current.memory_gib if current and self.engine is not None else 0.0
        refusal = self.guard.start_refusal(max(0.0, profile.memory_gib - freed), profile=name,
                                           profile_gib=profile.memory_gib)
        if refusal:
            raise Rejected("memory", f"profile {name}: {refusal}")
        op = self.commands.new_operation(CommandKind.SWITCH, name, self.profile_name)
        self.commands.put(Command(CommandKind.SWITCH, op, profile))
        return op

    def order_from_head(self, generation: str, profile: str, run: bool) -> None:
        """The head's order (worker only): run rank 1 of `generation` with `profile`, or stop (run=False).

        An engine of another generation, or any engine when told to stop, is ended now; the next one
        starts once the role sees the order (roles.Worker.before_start)."""
        engine_alive = self.engine is not None and self.engine.returncode is None
        if self.role.take_order(generation, profile, run, engine_alive):
            self.commands.put(Command(CommandKind.RESTART))

    def _validated_profile(self, name: str) -> Profile:
        """The profile files read for this operation (the only read: the Command carries the result)."""
        try:
            profiles = load_profiles(self.settings)  # pick up edits and new files in profiles.d
        except ConfigError as e:
            raise Rejected("invalid", str(e)) from None
        if name not in profiles:
            raise Rejected("unknown", unknown_profiles([name], profiles))
        try:
            profiles[name].check_requirements(self.settings)
            profiles[name].engine_args(self.settings)
            profiles[name].engine_env(self.settings)
        except RequirementError as e:
            raise Rejected("unmet", str(e)) from None
        except ConfigError as e:
            raise Rejected("invalid", str(e)) from None
        self.profiles = profiles
        return profiles[name]

    # ---- the main task ----------------------------------------------------------------------

    def install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        loop.add_signal_handler(signal.SIGINT, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)

    def _on_sighup(self) -> None:
        try:
            op = self.request_restart()
            log.info("SIGHUP: warm restart queued", op=op.id)
        except Rejected as e:
            log.warning("SIGHUP ignored", reason=str(e))

    def initial_profile(self) -> str:
        saved = self.store.load().active_profile
        clustered = self.settings.cluster is not None
        if saved and saved in self.profiles and self.profiles[saved].needs_cluster == clustered:
            return saved
        if saved in self.profiles:
            # [cluster] was added or removed since (docs/CLUSTER.md): the saved one cannot run any more.
            log.warning("saved profile does not fit this node's [cluster] setting, using the default",
                        saved=saved, default=self.settings.default_profile)
        elif saved:
            log.warning("saved profile no longer exists, using the default", saved=saved,
                        default=self.settings.default_profile)
        if self.settings.default_profile not in self.profiles:
            raise ConfigError(self.settings.source or "gptoss-spark.toml", "default_profile",
                              unknown_profiles([self.settings.default_profile], self.profiles),
                              "set it to a known profile or add that profile's .toml file")
        return self.settings.default_profile

    async def run(self) -> int:
        watchdog = asyncio.create_task(self._watchdog_loop(), name="watchdog")
        sampler = asyncio.create_task(self.telemetry.run(self._sample_context), name="telemetry")
        try:
            return await self._run()
        finally:
            watchdog.cancel()
            sampler.cancel()
            await self.alerts.drain()  # a give-up's alert goes out before the process exits

    async def _run(self) -> int:
        profile = self.initial_profile()
        # The next engine's profile when it is already read: at start (SupervisorParts) and as validated
        # by a restart or switch. None: read the files again (a retry after a failure, a rollback).
        loaded: Profile | None = self.profiles[profile]
        op: Operation | None = None
        rollback_to: str | None = None
        last_exit: str | None = None  # failure_signature of the last engine exit before ready
        while True:
            ended = await self._run_generation(profile, op, loaded)
            loaded = None
            if ended.reached_ready or ended.command is not None:
                last_exit = None
            if ended.reached_ready:
                rollback_to = None
            cmd = ended.command
            if cmd is None and self.role.head_decides(ended.reason):
                self.last_error = ended.reason  # this node's half ended: the head restarts both (cluster.py)
                continue
            if cmd is None:
                # The engine ended without being asked to: states.after_failure decides what next.
                self.last_error = ended.reason
                switching = op is not None and op.kind == CommandKind.SWITCH and not op.done.is_set()
                now = self.policy.clock()  # one reading: the decision and the record see the same window
                decision = after_failure(
                    Failure(ended.reason, ended.exit_code, ended.reached_ready, ended.requirement),
                    profile=profile, ever_ready=self.ever_ready, settings=self.settings.restart,
                    recent_failures=self.policy.recent_failures(now), last_exit=last_exit,
                    roll_back_to=rollback_to if switching else None)
                last_exit = decision.last_exit
                if decision.next == Next.UNMET:
                    self.sm.to(State.FAILED, decision.reason, profile)
                    return EXIT_REQUIREMENT
                if decision.next == Next.ROLL_BACK:
                    # A switch whose new profile never got ready: back to the last good one, at once.
                    assert op is not None and decision.profile is not None
                    self.switches["failed"] += 1
                    op.rolled_back_to = decision.profile
                    op.finish(False, decision.reason)
                    log.warning("switch failed, rolling back", target=profile, to=decision.profile, reason=ended.reason)
                    profile, rollback_to, op = decision.profile, None, None
                    continue  # next generation: stopping -> starting with the last-good profile
                if op is not None and not op.done.is_set():
                    op.finish(False, ended.reason)
                op = None
                if decision.counts_failure:
                    self.policy.record_failure(now)
                if decision.next == Next.RETRY:
                    self.sm.to(State.BACKOFF, decision.reason, profile)
                    cmd = await self.commands.wait(decision.delay)
                else:
                    self.sm.to(State.FAILED, decision.reason, profile)
                    if decision.next == Next.EXIT:
                        assert decision.exit_code is not None
                        return decision.exit_code
                    cmd = await self.commands.wait(None)
                if cmd is None:
                    continue

            # A command, whether it ended the engine or arrived while in backoff / failed.
            if op is not None and not op.done.is_set():
                op.finish(False, "cancelled: the service is stopping" if cmd.kind == CommandKind.STOP
                          else f"superseded by {cmd.kind.value}")
            if cmd.kind == CommandKind.STOP:
                self.sm.to(State.STOPPED, "stopped on request", profile)
                return EXIT_OK
            self.policy.reset()
            op = cmd.op
            loaded = cmd.profile
            if op is not None:
                op.status = OpStatus.RUNNING
                if cmd.kind == CommandKind.SWITCH:
                    rollback_to = self.store.load().last_good_profile or profile
                    profile = op.target or profile

    async def _run_generation(self, name: str, op: Operation | None, loaded: Profile | None = None) -> _Ended:
        """Start one engine for profile `name`, serve until something ends it, leave it stopped.

        loaded: that profile as already read (see _run); None reads the profile files now."""
        self.profile_name = name
        why = f"{op.kind.value} {op.id}" if op else "start"
        self.sm.to(State.STARTING, why, name)
        go = await self.role.before_start(name)
        if isinstance(go, Interrupted):
            return self._interrupted(go.while_)
        if isinstance(go, NotStarted):
            return self._end_without_engine(go.reason, requirement=go.requirement)
        if go.ordered:
            name = self.profile_name = go.profile
            loaded = None  # the head names the profile: this node's own files say what it is
        try:
            if loaded is None or loaded.name != name:
                self.profiles = load_profiles(self.settings)
                loaded = self.profiles[name]
            profile = loaded
            profile.check_requirements(self.settings)
        except (RequirementError, ConfigError, KeyError) as e:
            return self._end_without_engine(str(e) if not isinstance(e, KeyError) else self.role.missing_profile(name),
                                            requirement=True)
        if (no_memory := await self._memory_for_start(profile, name, op)) is not None:
            return no_memory

        engine = self.engine_factory(self.settings, profile)
        self.engine = engine
        try:
            await engine.start()
        except OSError as e:
            self.sm.to(State.STOPPING, "spawn failed", name)
            return _Ended(f"could not start the engine: {e}")
        self.sm.to(State.LOADING, f"engine pid {engine.pid}", name)
        probe = self.role.own_probe(engine) or \
            self.probe_factory(engine.base_url, self.settings.model.served_name, read_api_key(self.settings))

        ended = await self._load(engine, probe, name)
        await self._record_start(engine, name, ready=ended is None)
        if ended is None:
            self.ever_ready = True
            self.engine_ready_since = self.clock()
            self.sm.to(State.READY, self.role.ready_reason(engine.pid), name)
            self.notifier.ready(self._status_line())
            self.store.save(PersistedState(active_profile=name, last_good_profile=name))
            self._remember_started(profile)
            if op is not None and not op.done.is_set():
                if op.kind == CommandKind.SWITCH:
                    self.switches["ok"] += 1
                op.finish(True)
            ended = await self._serve(engine, probe, name)
            ended.reached_ready = True
        await self._stop_engine(engine, ended, name)
        return ended

    async def _memory_for_start(self, profile: Profile, name: str, op: Operation | None) -> _Ended | None:
        """None once the memory guard lets `profile` start (its claim recorded); else why the start ended.

        A refusal is not a crash: no engine ran, and a retry soon after finds the same memory. So the
        start waits for the memory, saying so in STATUS=, and spends nothing of the restart budget.
        A service that has served waits as long as it takes (restarting cannot free memory; a stop,
        restart or switch ends the wait); a first start gives up after memory.start_wait seconds as an
        unmet requirement, so `systemctl start` fails with the reason (exit 3) instead of hanging.
        A switch still in progress is not waited for: its refusal rolls back to the last good profile."""
        refusal = self.guard.start_refusal(profile.memory_gib, profile=name, claim=True)
        if refusal is None:
            return None
        switching = op is not None and op.kind == CommandKind.SWITCH and not op.done.is_set()
        if switching:
            return self._end_without_engine(f"memory guard refused start: {refusal}")
        bound = None if self.ever_ready else self.settings.memory.start_wait
        if op is not None and not op.done.is_set():  # a restart: it ended with no engine, and says why
            op.finish(False, f"memory guard refused start: {refusal}; the service starts {name} once memory frees")
        waited_from, shown = self.clock(), None
        start_job = StartJobKeeper(self.notifier, self.clock)
        while refusal is not None:
            waited = self.clock() - waited_from
            if bound is not None and waited >= bound:
                return self._end_without_engine(
                    f"memory guard refused start for {bound:g} s: {refusal}", requirement=True)
            if refusal != shown:
                shown = refusal
                self.last_error = f"memory guard refused start: {refusal}"
                log.warning("memory guard refused start: waiting for memory", profile=name, reason=refusal,
                            gives_up_after=bound)
                # reload_over: a `systemctl reload` waiting on this start is over (its restart failed).
                self.notifier.reload_over(f"starting: profile {name} waits for memory: {refusal}"[:200])
            if bound is not None:
                start_job.progress()
            if self.commands.pending is not None:
                return self._interrupted("waiting for memory")
            await self._sleep_or_wake(self.settings.memory.check_interval)
            refusal = self.guard.start_refusal(profile.memory_gib, profile=name, claim=True)
        log.info("memory available: starting", profile=name, waited_seconds=round(self.clock() - waited_from, 1))
        self.notifier.status(f"starting: profile {name}")
        return None

    def _interrupted(self, while_: str) -> _Ended:
        assert self.commands.pending is not None
        reason = f"{self.commands.pending.kind.value} requested while {while_}"
        self.sm.to(State.STOPPING, reason, self.profile_name)
        return _Ended(reason, self.commands.take())

    def _end_without_engine(self, reason: str, requirement: bool = False) -> _Ended:
        self.sm.to(State.STOPPING, reason, self.profile_name)
        return _Ended(reason, requirement=requirement)

    async def _load(self, engine: EngineProcess, probe: EngineProbe, name: str) -> _Ended | None:
        """Wait for /health 200 and a passing canary. None = ready; else why loading ended."""
        deadline = self.clock() + self.settings.timeouts.load
        start_job = StartJobKeeper(self.notifier, self.clock)
        last_canary_error = None
        refused = await self.role.after_spawn(name)
        if refused:
            return _Ended(refused)
        exit_task = asyncio.create_task(engine.exited())
        try:
            while True:
                now = self.clock()
                start_job.progress()
                if exit_task.done():
                    return await self._engine_died(engine, name, " while loading")
                if self.commands.pending is not None:
                    return _Ended(f"{self.commands.pending.kind.value} requested while loading", self.commands.take())
                danger = self.guard.danger()
                if danger:
                    return _Ended(f"memory guard: {danger}")
                if now >= deadline:
                    extra = f"; last canary error: {last_canary_error}" if last_canary_error else ""
                    return _Ended(f"engine not ready within timeouts.load={self.settings.timeouts.load:g} s{extra}")
                if fault := await self.role.fault(loading=True):
                    return _Ended(fault)
                self._report_load_progress(engine, name)
                if await probe.health(self.settings.timeouts.probe_timeout):
                    engine.startup.mark("health")
                    last_canary_error = await probe.canary(self.settings.timeouts.canary)
                    if last_canary_error is None and self.role.peer_joined():
                        engine.startup.mark("canary")
                        return None
                    log.warning("canary failed while loading", reason=last_canary_error, profile=name)
                await self._sleep_or_wake(LOAD_POLL_SECONDS, exit_task)
        finally:
            if not exit_task.done():
                exit_task.cancel()

    def _report_load_progress(self, engine: EngineProcess, name: str) -> None:
        """STATUS= names the start's phase and how long it has run (systemctl status shows where it is),
        sent at each new phase and every STATUS_REFRESH_SECONDS within one: a bounded rate to systemd."""
        rec = engine.startup
        now = time.monotonic()
        shown = (rec.current_phase(now), int((now - rec.spawned_at) // STATUS_REFRESH_SECONDS))
        if shown != self._load_phase_shown:
            self._load_phase_shown = shown
            self.notifier.status(f"loading: profile {name} ({rec.progress_line(now)})"[:200])

    def _remember_started(self, profile: Profile) -> None:
        if self.engine_args_started is None:
            return
        try:
            self.engine_args_started(self.settings, profile)
        except Exception as e:  # a cache: its trouble costs the next check its seconds, nothing else
            log.warning("accepted engine arguments not remembered", profile=profile.name, reason=str(e))

    async def _record_start(self, engine: EngineProcess, name: str, *, ready: bool) -> None:
        """One journal event per start: its phases, and what it compiled (a warning if anything)."""
        self._load_phase_shown = None
        rec = engine.startup
        if ready:
            await engine.count_cache_additions()
        self.starts.finish(rec)
        compiled = rec.compiled_anything()
        fields = {"profile": name, "ready": ready, "seconds": rec.ready_seconds,
                  "phases": " ".join(f"{p}={v:.1f}" for p, v in rec.phases().items()),
                  "cache_hits": rec.cache_hits}
        if ready and compiled:
            log.warning("engine start compiled kernels: warm the caches with `gptoss-spark warmup` "
                        f"({'; '.join(compiled)})", **fields)
        else:
            log.info("engine start" + ("" if ready else " ended before ready"), **fields,
                     compiled="; ".join(compiled) or "nothing")
        if ready and not compiled:
            # This start proved the caches warm for the current key (a start after an upgrade that changed
            # nothing of it, a pair's second start): `doctor` and `warmup --check` must not say "never warmed".
            try:
                await asyncio.to_thread(warm_marker.mark_warm_after_start, self.settings, engine.profile, rec)
            except Exception as e:  # a note for doctor: its trouble changes nothing of the service
                log.warning("warm marker not refreshed", profile=name, reason=str(e))

    async def _serve(self, engine: EngineProcess, probe: EngineProbe, name: str) -> _Ended:
        t = self.settings.timeouts
        stall = StallDetector(self.settings.wedge.stall_seconds, self.clock)
        health_failures = 0
        next_probe = self.clock() + t.probe_interval
        canary_every = self.settings.wedge.canary_interval
        next_canary = self.clock() + canary_every if canary_every else float("inf")
        exit_task = asyncio.create_task(engine.exited())
        try:
            while True:
                if exit_task.done():
                    return await self._engine_died(engine, name)
                if self.commands.pending is not None:
                    cmd = self.commands.take()
                    if cmd.kind != CommandKind.STOP:
                        if await self._refused_by_vllm(cmd, name, exit_task):
                            continue  # nothing stopped: this engine serves on
                        if self.commands.pending is not None:  # a stop came while vLLM's parser ran: it wins
                            if cmd.op is not None:
                                cmd.op.finish(False, "cancelled: the service is stopping")
                            continue
                        if exit_task.done():  # it died while vLLM's parser ran: the command waits its turn
                            self.commands.put(cmd)
                            continue
                        # systemd shows "reloading" until the READY=1 that the next generation sends.
                        self.notifier.reloading(f"{cmd.kind.value}: {name} -> {cmd.op.target if cmd.op else name}")
                    await self._drain(probe, name, exit_task)
                    return _Ended(f"{cmd.kind.value} requested", cmd)
                danger = self.guard.danger()
                if danger:
                    log.error("memory guard tripped: stopping the engine before the host freezes",
                              reason=danger, profile=name, pid=engine.pid)
                    return _Ended(f"memory guard: {danger}")
                now = self.clock()
                if now >= next_probe:
                    next_probe = now + t.probe_interval
                    if fault := await self.role.fault(loading=False):
                        return _Ended(fault)
                    if await probe.health(t.probe_timeout):
                        health_failures = 0
                    else:
                        health_failures += 1
                        if health_failures >= HEALTH_FAILURES_BEFORE_RESTART:
                            return _Ended(f"engine /health failed {health_failures} times in a row")
                    m = await probe.metrics(t.probe_timeout)
                    if m is not None:
                        stalled = stall.observe(m.running, m.generated_tokens)
                        if stalled:
                            return _Ended(f"wedged: {stalled}")
                        if m.running == 0 and m.waiting == 0 and now >= next_canary:
                            next_canary = now + canary_every
                            err = await probe.canary(t.canary)
                            if err:
                                return _Ended(f"wedged: /health answers but {err}")
                await self._sleep_or_wake(min(self.settings.memory.check_interval,
                                              max(0.05, next_probe - self.clock())), exit_task)
        finally:
            if not exit_task.done():
                exit_task.cancel()

    async def _refused_by_vllm(self, cmd: Command, name: str, exit_task: asyncio.Task[int]) -> bool:
        """Ask the engine's own vLLM parser about the target's argv before the serving engine is touched.

        True = refused: the operation failed with vLLM's one error line and nothing changed.
        The engine and the command slot keep being watched meanwhile: if the engine dies or a
        stop arrives, the check is dropped (False) and the caller sees which.
        """
        target = (cmd.op.target if cmd.op else None) or name
        profile = cmd.profile or self.profiles.get(target)
        if profile is None or self.engine_args_check is None:
            return False
        if cmd.op is not None:
            cmd.op.status = OpStatus.RUNNING
        check = asyncio.create_task(self.engine_args_check(self.settings, profile))
        wake = asyncio.create_task(self.commands.wake.wait())  # CommandQueue.put sets it: a stop (nothing else fits now)
        try:
            await asyncio.wait({check, exit_task, wake}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()
        if not check.done():
            check.cancel()
            await asyncio.gather(check, return_exceptions=True)
            return False
        try:
            rejection = check.result()
        except ArgCheckUnavailable as e:
            # The checker's own trouble is no reason to refuse: the start and its rollback still guard.
            log.warning("engine arguments not checked, going ahead", profile=target, reason=str(e))
            return False
        if rejection is None:
            return False
        message = (f"profile {target}: vLLM rejects its engine arguments: {rejection}; "
                   f"nothing was stopped, {name} still serves")
        log.error("refused before stopping the engine", kind=cmd.kind.value, target=target,
                  profile=name, reason=rejection)
        # A failed operation like any other (the page, /admin/status, /metrics count it), though the
        # serving engine never stopped: the message says so, and nothing else here changes.
        self.last_error = message
        if cmd.kind == CommandKind.SWITCH:
            self.switches["failed"] += 1
        if cmd.op is not None:
            cmd.op.finish(False, message)
        return True

    async def _engine_died(self, engine: EngineProcess, name: str, when: str = "") -> _Ended:
        # Out of ready/loading at once: /admin/health must not say "ready" for a dead engine while
        # its last output drains (up to 2 s when an orphaned child holds the pipe).
        self.sm.to(State.STOPPING, engine.exit_reason(when), name)
        await engine.output_settled()
        return _Ended(engine.exit_reason(when), exit_code=engine.returncode)

    async def _drain(self, probe: EngineProbe, name: str, exit_task: asyncio.Task[int]) -> None:
        """Bounded wait for running requests to finish. New requests may still arrive: the bound holds."""
        self.sm.to(State.DRAINING, f"waiting up to {self.settings.timeouts.drain:g} s for running requests", name)
        deadline = self.clock() + self.settings.timeouts.drain
        while self.clock() < deadline and not exit_task.done():
            m = await probe.metrics(self.settings.timeouts.probe_timeout)
            if m is None or (m.running == 0 and m.waiting == 0):
                return
            await asyncio.sleep(0.2)
        if not exit_task.done():
            log.warning("drain timeout: stopping with requests still running", profile=name)

    async def _stop_engine(self, engine: EngineProcess, ended: _Ended, name: str) -> None:
        if self.state != State.STOPPING:  # _engine_died already moved there
            self.sm.to(State.STOPPING, ended.reason, name)
        memory = ended.reason.startswith("memory guard")
        if ended.command is None and (memory or ended.reason.startswith(WEDGE_REASONS)):
            self.alerts.notify("memory_guard" if memory else "wedged", self.state.value, name, ended.reason)
        try:
            # Memory danger: every second counts, give it very little grace.
            await engine.stop(grace=2.0 if memory else None)
        except RuntimeError as e:
            log.error("engine tree survived SIGKILL", reason=str(e))
            self.last_error = str(e)
        self.engine_ready_since = None
        await self.role.after_stop(name)

    async def _sleep_or_wake(self, seconds: float, exit_task: asyncio.Task[int] | None = None) -> None:
        """Sleep until `seconds` pass, a command arrives or (if given) the engine exits."""
        wake = asyncio.create_task(self.commands.wake.wait())
        try:
            await asyncio.wait({wake} | ({exit_task} if exit_task else set()), timeout=seconds,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()

    async def _watchdog_loop(self) -> None:
        interval = watchdog_interval()
        if interval is None:
            return
        # Sent from this event loop: if run() blocks the loop, the pings stop and systemd acts.
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    # ---- reporting --------------------------------------------------------------------------

    def _sample_context(self) -> SampleContext:
        engine = self.engine
        alive = engine is not None and engine.returncode is None
        return SampleContext(self.state.value, self.profile_name, engine.pid if alive else None,
                             engine.base_url if alive else None)

    def _status_line(self) -> str:
        return f"{self.state.value}: profile {self.profile_name}"

    def _on_transition(self, t: Transition) -> None:
        log.info("state", state=t.new.value, previous=t.old.value, profile=t.profile, reason=t.reason,
                 pid=self.engine.pid if self.engine else None)
        if t.new == State.FAILED:
            self.alerts.notify("gave_up", t.new.value, t.profile, t.reason)
        if t.new in (State.FAILED, State.STOPPED) and self.guard.budget is not None:
            # No engine and none coming until someone asks: its memory is the other services' to use
            # (budget.py); the next start claims it again, through the same check.
            if self.guard.budget.release():
                log.info("memory claim released", state=t.new.value, claim=str(self.guard.budget.own_file))
        self.telemetry.journal(t.new.value)
        line = f"{t.new.value}: profile {t.profile} ({t.reason})"
        if t.new in (State.BACKOFF, State.FAILED):
            self.notifier.reload_over(line[:200])  # STATUS; a reload that ends here failed: systemd hears it is over
        else:
            self.notifier.status(line[:200])
