"""The command slot between the outside and the supervisor's loop (service/operations.py)."""

from __future__ import annotations

import asyncio

import pytest

from gptoss_spark.service.operations import OPERATIONS_KEPT, Command, CommandQueue, Rejected
from gptoss_spark.service.status import CommandKind, OpStatus


def test_a_stop_outranks_a_waiting_switch_and_cancels_its_operation():
    q = CommandQueue()
    op = q.new_operation(CommandKind.SWITCH, "demo-b", "demo")
    q.put(Command(CommandKind.SWITCH, op))
    with pytest.raises(Rejected) as e:
        q.ensure_idle()
    assert e.value.code == "busy" and op.id in str(e.value)
    q.put(Command(CommandKind.RESTART))  # the slot is taken: anything but a stop waits its turn elsewhere
    assert q.pending is not None and q.pending.kind == CommandKind.SWITCH
    q.put(Command(CommandKind.STOP))
    assert q.pending is not None and q.pending.kind == CommandKind.STOP
    assert (op.status, op.error) == (OpStatus.FAILED, "cancelled: the service is stopping")
    with pytest.raises(Rejected, match="a stop is in progress"):
        q.ensure_idle()


def test_a_taken_operation_stays_busy_until_done():
    q = CommandQueue()
    op = q.new_operation(CommandKind.RESTART, "demo", "demo")
    q.put(Command(CommandKind.RESTART, op))
    assert q.take() is not None and q.pending is None and not q.wake.is_set()
    assert q.current is op
    with pytest.raises(Rejected):
        q.ensure_idle()
    op.finish(True)
    q.ensure_idle()
    assert q.views()[op.id].status == OpStatus.SUCCEEDED


def test_only_the_last_operations_are_kept_oldest_first():
    q = CommandQueue()
    ops = [q.new_operation(CommandKind.RESTART, "demo", "demo") for _ in range(OPERATIONS_KEPT + 3)]
    assert list(q.views()) == [op.id for op in ops[3:]]
    assert ops[0].id not in q.operations


def test_wait_returns_the_next_command_or_none_after_the_delay():
    async def go():
        q = CommandQueue()
        assert await q.wait(0.01) is None
        asyncio.get_running_loop().call_later(0.01, q.put, Command(CommandKind.STOP))
        cmd = await q.wait(None)
        return cmd, q.pending

    cmd, left = asyncio.run(go())
    assert cmd is not None and cmd.kind == CommandKind.STOP and left is None
