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

from .config import RestartSettings

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

    def _prune(self) -> None:
        horizon = self.clock() - self.settings.window
        while self._failures and self._failures[0] < horizon:
            self._failures.popleft()

    def record_failure(self) -> float | None:
        """Note a failure now. Returns the delay before the next try, or None to give up."""
        self._prune()
        self._failures.append(self.clock())
        n = len(self._failures)
        if n >= self.settings.max_crashes:
            return None
        self.total_restarts += 1
        return min(self.settings.backoff_initial * 2 ** (n - 1), self.settings.backoff_max)

    def recent_failures(self) -> int:
        self._prune()
        return len(self._failures)

    def reset(self) -> None:
        """A human asked for a fresh start (restart / profile switch): forget the old streak."""
        self._failures.clear()


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
