"""The state machine and its policies, walked with a fake clock."""

from __future__ import annotations

import pytest

from gptoss_spark.service.config import RestartSettings
from gptoss_spark.service.states import ALLOWED, IllegalTransition, RestartPolicy, StallDetector, State, StateMachine


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


def test_happy_path_and_time_in_state():
    clock = FakeClock()
    seen = []
    sm = StateMachine(clock, on_transition=seen.append)
    sm.to(State.STARTING, "start", "plain")
    clock.advance(2)
    sm.to(State.LOADING, "pid 1", "plain")
    clock.advance(30)
    sm.to(State.READY, "canary ok", "plain")
    clock.advance(100)
    secs = sm.seconds_in()
    assert secs[State.STARTING] == 2 and secs[State.LOADING] == 30 and secs[State.READY] == 100
    assert [t.new for t in seen] == [State.STARTING, State.LOADING, State.READY]
    assert seen[-1].old == State.LOADING and seen[-1].reason == "canary ok" and seen[-1].profile == "plain"


@pytest.mark.parametrize("old,new", [
    (State.STOPPED, State.READY),      # READY only through loading + canary
    (State.STARTING, State.READY),
    (State.BACKOFF, State.READY),
    (State.FAILED, State.READY),
    (State.READY, State.STARTING),     # an engine is never replaced without stopping the old one
    (State.LOADING, State.BACKOFF),    # every engine end goes through stopping (tree sweep)
    (State.READY, State.BACKOFF),
])
def test_illegal_transitions(old, new):
    sm = StateMachine(FakeClock())
    sm.state = old
    with pytest.raises(IllegalTransition):
        sm.to(new, "x")
    assert sm.state == old


def test_ready_is_reachable_only_from_loading():
    assert [s for s, nxt in ALLOWED.items() if State.READY in nxt] == [State.LOADING]


def test_history_is_bounded():
    sm = StateMachine(FakeClock(), history=4)
    for _ in range(5):
        sm.to(State.STARTING, "s")
        sm.to(State.STOPPING, "x")
        sm.to(State.STOPPED, "y")
    assert len(sm.history) == 4


def test_backoff_doubles_up_to_max_then_gives_up():
    clock = FakeClock()
    p = RestartPolicy(RestartSettings(backoff_initial=2, backoff_max=10, max_crashes=5, window=600), clock)
    delays = []
    for _ in range(4):
        delays.append(p.record_failure())
        clock.advance(1)
    assert delays == [2, 4, 8, 10]
    assert p.record_failure() is None   # 5th failure within the window: give up
    assert p.total_restarts == 4


def test_failures_outside_the_window_are_forgotten():
    clock = FakeClock()
    p = RestartPolicy(RestartSettings(backoff_initial=1, backoff_max=60, max_crashes=3, window=100), clock)
    assert p.record_failure() == 1
    assert p.record_failure() == 2
    clock.advance(101)                  # both fall out of the window
    assert p.recent_failures() == 0
    assert p.record_failure() == 1      # streak starts over
    assert p.record_failure() == 2
    assert p.record_failure() is None


def test_reset_forgets_the_streak():
    p = RestartPolicy(RestartSettings(max_crashes=2), FakeClock())
    p.record_failure()
    p.reset()
    assert p.record_failure() is not None


def test_stall_detector():
    clock = FakeClock()
    d = StallDetector(stall_seconds=60, clock=clock)
    assert d.observe(running=1, generated_tokens=10) is None
    clock.advance(30)
    assert d.observe(1, 20) is None        # tokens moved
    clock.advance(30)
    assert d.observe(1, 20) is None        # stalled since now
    clock.advance(59)
    assert d.observe(1, 20) is None
    clock.advance(1)
    assert "no token generated for 60 s" in d.observe(1, 20)


def test_idle_engine_is_not_stalled():
    clock = FakeClock()
    d = StallDetector(stall_seconds=10, clock=clock)
    for _ in range(5):
        assert d.observe(running=0, generated_tokens=5) is None
        clock.advance(100)
