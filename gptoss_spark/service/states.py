"""The supervisor's states, named once, and the pure policies that drive them.

Everything here is synchronous and takes a clock, so the unit tests can walk
the state machine and the restart / wedge policies with a fake one.
"""

from __future__ import annotations

import collections
import enum
import time
from dataclasses import dataclass
from typing import Callable

from ..base.exit_codes import EXIT_GAVE_UP, EXIT_REQUIREMENT, EXIT_USAGE
from .config import RestartSettings
from .exit_reason import failure_signature

Clock = Callable[[], float]


class State(str, enum.Enum):
    STARTING = "starting"   # checks passed, spawning the engine
    LOADING = "loading"     # engine process up, waiting for /health + canary
    READY = "ready"         # serving
    DRAINING = "draining"   # bounded wait for running requests before a stop
    STOPPING = "stopping"   # engine being stopped (TERM -> grace -> KILL group)
    STOPPED = "stopped"     # no engine, not trying
    BACKOFF = "backoff"     # engine died or was stopped by a guard; waiting to retry
    FAILED = "failed"       # gave up; needs a human or a profile change


ALLOWED: dict[State, frozenset[State]] = {
    State.STOPPED: frozenset({State.STARTING}),
    State.STARTING: frozenset({State.LOADING, State.BACKOFF, State.FAILED, State.STOPPING}),
    State.LOADING: frozenset({State.READY, State.STOPPING}),
    State.READY: frozenset({State.DRAINING, State.STOPPING}),
    State.DRAINING: frozenset({State.STOPPING}),
    State.STOPPING: frozenset({State.STOPPED, State.BACKOFF, State.FAILED, State.STARTING}),
    State.BACKOFF: frozenset({State.STARTING, State.FAILED, State.STOPPING, State.STOPPED}),
    State.FAILED: frozenset({State.STARTING, State.STOPPED}),
}


class IllegalTransition(RuntimeError):
    pass


@dataclass(frozen=True)
class Transition:
    at: float          # clock time
    wall: float        # epoch seconds, for humans
    old: State
    new: State
    reason: str
    profile: str | None


class StateMachine:
    """Current state, the bounded history of transitions, and seconds spent in each state."""

    def __init__(self, clock: Clock = time.monotonic, history: int = 50,
                 on_transition: Callable[[Transition], None] | None = None):
        self.clock = clock
        self.state = State.STOPPED
        self.since = clock()
        self.history: collections.deque[Transition] = collections.deque(maxlen=history)
        self._seconds = dict.fromkeys(State, 0.0)
        self._listeners = [on_transition] if on_transition else []

    def subscribe(self, fn: Callable[[Transition], None]) -> None:
        self._listeners.append(fn)

    def to(self, new: State, reason: str, profile: str | None = None) -> Transition:
        if new not in ALLOWED[self.state]:
            raise IllegalTransition(f"{self.state.value} -> {new.value} ({reason})")
        now = self.clock()
        self._seconds[self.state] += now - self.since
        t = Transition(now, time.time(), self.state, new, reason, profile)
        self.state, self.since = new, now
        self.history.append(t)
        for fn in self._listeners:
            fn(t)
        return t

    def seconds_in(self) -> dict[State, float]:
        out = dict(self._seconds)
        out[self.state] += self.clock() - self.since
        return out


class RestartPolicy:
    """Exponential backoff after failures; give up after max_crashes within window seconds."""

    def __init__(self, settings: RestartSettings, clock: Clock = time.monotonic):
        self.settings = settings
        self.clock = clock
        self._failures: collections.deque[float] = collections.deque()
        self.total_restarts = 0

    def _prune(self, now: float) -> None:
        horizon = now - self.settings.window
        while self._failures and self._failures[0] < horizon:
            self._failures.popleft()

    def record_failure(self, now: float | None = None) -> float | None:
        """Note a failure now (or at `now`, this policy's clock). Returns the delay before the next try, or None to give up."""
        now = self.clock() if now is None else now
        self._prune(now)
        self._failures.append(now)
        delay = backoff_delay(len(self._failures), self.settings)
        if delay is not None:
            self.total_restarts += 1
        return delay

    def recent_failures(self, now: float | None = None) -> int:
        """Failures within the window before now (or `now`, read once by a caller that then decides on it)."""
        self._prune(self.clock() if now is None else now)
        return len(self._failures)

    def reset(self) -> None:
        """A human asked for a fresh start (restart / profile switch): forget the old streak."""
        self._failures.clear()


def backoff_delay(failures: int, settings: RestartSettings) -> float | None:
    """The wait before the next try after the `failures`-th failure in the window; None = give up."""
    if failures >= settings.max_crashes:
        return None
    return min(settings.backoff_initial * 2 ** (failures - 1), settings.backoff_max)


def hopeless(exit_code: int | None, reached_ready: bool, reason: str,
             last_exit: str | None) -> tuple[str | None, str | None]:
    """(why a retry cannot help, or None; the signature to compare the next exit with).

    Only exits before ready count: vLLM's usage error (exit 2), or the same exit twice in a
    row. Crashes after ready, load timeouts, health and memory failures keep the backoff."""
    if exit_code is None or reached_ready:
        return None, last_exit
    if exit_code == EXIT_USAGE:
        return "the engine rejected its arguments (exit 2)", None
    sig = failure_signature(reason)
    return ("the engine failed the same way twice in a row" if sig == last_exit else None), sig


@dataclass(frozen=True)
class Failure:
    """An engine generation that ended without being asked to, in plain facts."""

    reason: str
    exit_code: int | None = None   # set when the engine process itself ended
    reached_ready: bool = False
    requirement: bool = False      # a requirement of the profile is unmet (no retry can meet it)


class Next(str, enum.Enum):
    UNMET = "unmet"          # a requirement unmet before the engine ever served: exit at once (EXIT_REQUIREMENT)
    EXIT = "exit"            # failed, and the process exits with Decision.exit_code
    ROLL_BACK = "roll back"  # a switch whose target never got ready: start Decision.profile at once
    STAY_FAILED = "stay failed"  # failed, but up: wait for a restart or switch
    RETRY = "retry"          # backoff for Decision.delay seconds, then start again


@dataclass(frozen=True)
class Decision:
    """What the supervisor does after a Failure. `reason` is the state transition's reason
    (for ROLL_BACK: the failed switch's error); counts_failure: record it in the RestartPolicy."""

    next: Next
    reason: str
    last_exit: str | None
    exit_code: int | None = None
    delay: float | None = None
    profile: str | None = None
    counts_failure: bool = False


def after_failure(failure: Failure, *, profile: str, ever_ready: bool, settings: RestartSettings,
                  recent_failures: int, last_exit: str | None, roll_back_to: str | None) -> Decision:
    """Give up, roll back or back off after an engine generation of `profile` ended on its own.

    recent_failures: the RestartPolicy's failures in its window before this one; last_exit: the
    failure signature of the last exit before ready (hopeless); roll_back_to: the last good profile
    when a switch to `profile` is in progress, else None. Pure: the caller carries the decision out."""
    why = failure.reason
    if failure.requirement and not ever_ready:
        return Decision(Next.UNMET, why, last_exit, exit_code=EXIT_REQUIREMENT)
    if roll_back_to:
        return Decision(Next.ROLL_BACK, f"profile {profile} failed: {why}; rolled back to {roll_back_to}",
                        last_exit, profile=roll_back_to)
    # Never served (or told to exit): `systemctl start` must fail loudly, not hang or pretend;
    # RestartPreventExitStatus keeps systemd from looping on it.
    exits = not ever_ready or settings.on_give_up == "exit"
    give_up = Next.EXIT if exits else Next.STAY_FAILED
    reason_hopeless, last_exit = hopeless(failure.exit_code, failure.reached_ready, why, last_exit)
    if reason_hopeless:
        # Retrying cannot fix it: fail now with the engine's own line, not after max_crashes.
        return Decision(give_up, f"gave up at once, {reason_hopeless}: {why}", last_exit,
                        exit_code=EXIT_GAVE_UP if exits else None)
    if failure.requirement:  # unmet after having served: no retry, and not counted as a crash
        delay, failures = None, recent_failures
    else:
        failures = recent_failures + 1
        delay = backoff_delay(failures, settings)
    if delay is None:
        if exits:
            return Decision(Next.EXIT, f"gave up: {why}", last_exit, counts_failure=not failure.requirement,
                            exit_code=EXIT_REQUIREMENT if failure.requirement else EXIT_GAVE_UP)
        return Decision(Next.STAY_FAILED, f"gave up after {failures} failures: {why}", last_exit,
                        counts_failure=not failure.requirement)
    return Decision(Next.RETRY, f"retry in {delay:g} s: {why}", last_exit, delay=delay, counts_failure=True)


class StallDetector:
    """Requests running but the generated-token counter not moving for stall_seconds = wedged."""

    def __init__(self, stall_seconds: float, clock: Clock = time.monotonic):
        self.stall_seconds = stall_seconds
        self.clock = clock
        self._last_tokens: float | None = None
        self._stalled_since: float | None = None

    def observe(self, running: float, generated_tokens: float) -> str | None:
        now = self.clock()
        moved = self._last_tokens is None or generated_tokens != self._last_tokens
        self._last_tokens = generated_tokens
        if running <= 0 or moved:
            self._stalled_since = None
            return None
        if self._stalled_since is None:
            self._stalled_since = now
            return None
        stalled = now - self._stalled_since
        if stalled >= self.stall_seconds:
            return (f"{running:g} request(s) running but no token generated for {stalled:.0f} s")
        return None
