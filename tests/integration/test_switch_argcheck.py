"""The supervisor's engine-argument check around the serving engine, with the stand-in engine
(faults on demand) and a check function whose answer and timing the test controls. vLLM's
real parser and a real engine: tests/unit/test_argcheck.py, tests/integration/test_admin_real_engine.py.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from gptoss_spark.admin.metrics import make_registry, render
from gptoss_spark.admin.page import render_page
from gptoss_spark.service.states import State
from gptoss_spark.base.exit_codes import EXIT_OK
from gptoss_spark.service.supervisor import OpStatus
from tests.helpers.supervisor_settings import make_settings
from tests.integration.test_supervisor_faults import Harness, run

pytestmark = pytest.mark.integration


class Check:
    """engine_args_check: waits until released, then answers `verdict`; records calls and cancellation."""

    def __init__(self, verdict: str | None = None):
        self.verdict = verdict
        self.release = asyncio.Event()
        self.calls: list[str] = []
        self.cancelled = False

    async def __call__(self, settings, profile):
        self.calls.append(profile.name)
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return self.verdict


def test_a_rejected_target_leaves_the_serving_engine_alone(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"good": "", "other": ""}))
        h.sup.engine_args_check = check = Check("unrecognized arguments: --nope")
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        pid, seen = h.sup.engine.pid, len(h.sup.sm.history)
        op = h.sup.request_switch("other")
        await h.until(lambda: check.calls, what="check called")
        assert h.sup.state == State.READY  # serving while the parser runs
        check.release.set()
        await asyncio.wait_for(op.done.wait(), 10)
        assert op.status == OpStatus.FAILED and op.rolled_back_to is None
        assert op.error == ("profile other: vLLM rejects its engine arguments: unrecognized arguments: --nope; "
                            "nothing was stopped, good still serves")
        assert (h.sup.engine.pid, h.sup.state, len(h.sup.sm.history)) == (pid, State.READY, seen)
        # Counted and shown as a failed switch, with words that do not claim the engine failed.
        assert h.sup.switches == {"ok": 0, "failed": 1}
        st = h.sup.status()
        assert st.last_error == op.error and st.counters.switches_failed == 1
        metrics = render(make_registry(h.sup.status)).decode()
        assert 'gptoss_spark_profile_switches_total{outcome="failed"} 1.0' in metrics
        page = render_page(st, nonce="n")
        assert "0 ok, 1 failed" in page and "nothing was stopped, good still serves" in page
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_an_engine_death_during_the_check_is_handled_then_the_switch_goes_on(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"good": "", "other": ""}))
        h.sup.engine_args_check = check = Check(None)
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        op = h.sup.request_switch("other")
        await h.until(lambda: check.calls, what="check called")
        os.kill(h.sup.engine.pid, signal.SIGKILL)
        await h.until(lambda: check.cancelled, what="check dropped for the death")
        check.release.set()
        await asyncio.wait_for(op.done.wait(), 20)
        assert op.status == OpStatus.SUCCEEDED, op.error
        assert h.sup.profile_name == "other" and h.sup.state == State.READY
        assert any("killed by SIGKILL" in t.reason for t in h.sup.sm.history)
        assert await h.stop() == EXIT_OK
    run(scenario())


def test_a_stop_during_the_check_wins(tmp_path):
    async def scenario():
        h = Harness(tmp_path, make_settings(tmp_path, {"good": "", "other": ""}))
        h.sup.engine_args_check = check = Check(None)  # never released
        h.start()
        await h.until(lambda: h.sup.state == State.READY, what="ready")
        op = h.sup.request_switch("other")
        await h.until(lambda: check.calls, what="check called")
        assert await h.stop() == EXIT_OK
        assert check.cancelled
        assert op.status == OpStatus.FAILED and op.error == "cancelled: the service is stopping"
        assert h.sup.profile_name == "good"
    run(scenario())
