"""The state machine and its policies, walked with a fake clock."""

from __future__ import annotations

import pytest

from gptoss_spark.base.exit_codes import EXIT_GAVE_UP, EXIT_REQUIREMENT
from gptoss_spark.service.config import RestartSettings
from gptoss_spark.service.states import (ALLOWED, Decision, Failure, IllegalTransition, Next, RestartPolicy,
                                         StallDetector, State, StateMachine, after_failure)


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


# ---- after_failure: give up, roll back or back off ---------------------------------------------

CRASH = "engine exited with code 1 while loading: RuntimeError: CUDA error: an illegal memory access"
OTHER_CRASH = "engine exited with code 1 while loading: OSError: address already in use"


def decide(policy: RestartPolicy, failure: Failure, *, ever_ready: bool = True, last_exit: str | None = None,
           roll_back_to: str | None = None) -> Decision:
    """What the supervisor does: one clock reading for the decision and the record it makes."""
    now = policy.clock()
    d = after_failure(failure, profile="demo", ever_ready=ever_ready, settings=policy.settings,
                      recent_failures=policy.recent_failures(now), last_exit=last_exit, roll_back_to=roll_back_to)
    if d.counts_failure:
        delay = policy.record_failure(now)
        assert delay == d.delay  # the policy's own arithmetic agrees with the decision's
    return d


def test_crashes_after_serving_back_off_doubling_then_stay_failed_and_the_window_forgets():
    clock = FakeClock()
    p = RestartPolicy(RestartSettings(backoff_initial=2, backoff_max=60, max_crashes=3, window=100), clock)
    crash = Failure("engine exited with code 1", exit_code=1, reached_ready=True)
    first, second = decide(p, crash), decide(p, crash)
    assert (first.next, first.delay, first.reason) == (Next.RETRY, 2, "retry in 2 s: engine exited with code 1")
    assert (second.next, second.delay) == (Next.RETRY, 4)
    third = decide(p, crash)
    assert (third.next, third.exit_code, third.counts_failure) == (Next.STAY_FAILED, None, True)
    assert third.reason == "gave up after 3 failures: engine exited with code 1"
    assert p.recent_failures() == 3 and p.total_restarts == 2
    clock.advance(101)  # the streak fell out of the window
    assert (decide(p, crash).next, p.recent_failures()) == (Next.RETRY, 1)


def test_giving_up_exits_when_never_served_or_told_to():
    crash = Failure("engine /health failed 3 times in a row")
    never = decide(RestartPolicy(RestartSettings(max_crashes=1), FakeClock()), crash, ever_ready=False)
    assert (never.next, never.exit_code, never.reason) == (Next.EXIT, EXIT_GAVE_UP, f"gave up: {crash.reason}")
    told = decide(RestartPolicy(RestartSettings(max_crashes=1, on_give_up="exit"), FakeClock()), crash)
    assert (told.next, told.exit_code) == (Next.EXIT, EXIT_GAVE_UP)


def test_an_unmet_requirement_is_never_retried_nor_counted():
    p = RestartPolicy(RestartSettings(max_crashes=3), FakeClock())
    unmet = Failure("profile demo needs /nonexistent/head", requirement=True)
    first = decide(p, unmet, ever_ready=False)
    assert (first.next, first.exit_code, first.reason) == (Next.UNMET, EXIT_REQUIREMENT, unmet.reason)
    p.record_failure()
    served = decide(p, unmet)  # after serving: up and failed, the count as it was
    assert (served.next, served.counts_failure) == (Next.STAY_FAILED, False)
    assert served.reason == f"gave up after 1 failures: {unmet.reason}" and p.recent_failures() == 1
    told = decide(RestartPolicy(RestartSettings(on_give_up="exit"), FakeClock()), unmet)
    assert (told.next, told.exit_code) == (Next.EXIT, EXIT_REQUIREMENT)


def test_the_same_exit_before_ready_twice_gives_up_at_once_another_one_backs_off():
    p = RestartPolicy(RestartSettings(max_crashes=5), FakeClock())
    one = decide(p, Failure(CRASH, exit_code=1), ever_ready=False)
    assert one.next == Next.RETRY and one.last_exit is not None
    other = decide(p, Failure(OTHER_CRASH, exit_code=1), ever_ready=False, last_exit=one.last_exit)
    assert other.next == Next.RETRY and other.last_exit != one.last_exit
    again = decide(p, Failure(OTHER_CRASH, exit_code=1), ever_ready=False, last_exit=other.last_exit)
    assert (again.next, again.exit_code, again.counts_failure) == (Next.EXIT, EXIT_GAVE_UP, False)
    assert again.reason == f"gave up at once, the engine failed the same way twice in a row: {OTHER_CRASH}"
    assert p.recent_failures() == 2  # the hopeless one is not a crash to back off from
    # After serving, the same give-up keeps the service up, failed.
    up = decide(p, Failure(OTHER_CRASH, exit_code=1), last_exit=other.last_exit)
    assert (up.next, up.exit_code) == (Next.STAY_FAILED, None)


def test_vllm_rejecting_its_arguments_is_hopeless_the_first_time():
    d = decide(RestartPolicy(RestartSettings(), FakeClock()), Failure("usage: vllm serve ...", exit_code=2),
               ever_ready=False)
    assert (d.next, d.exit_code, d.last_exit) == (Next.EXIT, EXIT_GAVE_UP, None)
    assert "the engine rejected its arguments (exit 2)" in d.reason


def test_crashes_after_ready_and_failures_without_an_exit_are_never_hopeless():
    p = RestartPolicy(RestartSettings(max_crashes=9), FakeClock())
    for failure in (Failure(CRASH, exit_code=1, reached_ready=True), Failure("memory guard: low")):
        d = decide(p, failure, last_exit="sig")
        assert (d.next, d.last_exit) == (Next.RETRY, "sig")


def test_a_switch_that_never_got_ready_rolls_back_before_anything_else():
    p = RestartPolicy(RestartSettings(max_crashes=1), FakeClock())
    d = decide(p, Failure("usage: bad flag", exit_code=2), roll_back_to="demo-b", last_exit="sig")
    assert (d.next, d.profile, d.counts_failure, d.last_exit) == (Next.ROLL_BACK, "demo-b", False, "sig")
    assert d.reason == "profile demo failed: usage: bad flag; rolled back to demo-b"
    assert p.recent_failures() == 0
    # ... except an unmet requirement before ever serving: nothing to roll back to.
    assert decide(p, Failure("unmet", requirement=True), ever_ready=False, roll_back_to="demo-b").next == Next.UNMET
