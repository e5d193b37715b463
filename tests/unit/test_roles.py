"""Each node's part in the engine (service/roles.py), driven alone: the other node is a stand-in
for its admin API (PeerClient's node/order), the supervisor's command slot is the real one.

The whole two-node protocol with real engines on two network namespaces is tests/integration/test_cluster.py."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from gptoss_spark.service import cluster
from gptoss_spark.service.config import Settings
from gptoss_spark.service.operations import Command, CommandQueue, Rejected
from gptoss_spark.service.roles import Go, Head, Interrupted, NotStarted, Solo, Worker, role_for
from gptoss_spark.service.states import State
from gptoss_spark.service.status import CommandKind
from gptoss_spark.service.systemd import Notifier

HEAD = {"role": "head", "address": "10.0.0.1", "peer": "10.0.0.2", "interface": "eth1"}
WORKER = {**HEAD, "role": "worker", "address": "10.0.0.2", "peer": "10.0.0.1"}
GEN = "a" * 12


def make(tmp_path: Path, c: dict | None, clock=lambda: 0.0, **timeouts) -> Solo:
    data = {"model": {"dir": str(tmp_path)}, "admin": {"host": "0.0.0.0"},
            "paths": {"state_dir": str(tmp_path / "state")}, "timeouts": timeouts}
    if c is not None:
        data["cluster"] = c
    return role_for(Settings.model_validate(data), CommandQueue(), Notifier(socket_path=""), clock)


class StandInPeer:
    """The other node's admin API as PeerClient sees it: answers in turn, orders recorded."""

    def __init__(self, *answers, expect: str = "worker"):
        self.answers = list(answers)
        self.orders: list[tuple[str, str, bool]] = []
        self.failures = 0
        self.expect = expect

    watch = cluster.PeerClient.watch  # the real failure count, over the answers below

    async def node(self, timeout: float):
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    async def order(self, generation: str, profile: str, run: bool, timeout: float):
        self.orders.append((generation, profile, run))
        return None


def test_the_role_follows_the_cluster_setting(tmp_path):
    assert type(make(tmp_path, None)) is Solo
    assert type(make(tmp_path, HEAD)) is Head
    assert type(make(tmp_path, WORKER)) is Worker


def test_one_node_waits_for_nobody_and_shows_no_cluster(tmp_path):
    solo = make(tmp_path, None)
    solo.refuse_request("switch")  # takes requests
    assert asyncio.run(solo.before_start("demo")) == Go("demo")
    assert asyncio.run(solo.fault(loading=True)) is None and solo.peer_joined()
    assert solo.status(State.READY, "demo", None, None) is None
    assert solo.ready_reason(7) == "engine pid 7 passed /health and the canary"
    with pytest.raises(AssertionError):
        solo.take_order(GEN, "demo", True, engine_alive=False)


def test_the_worker_refuses_requests_and_runs_only_a_new_generation_on_order(tmp_path):
    worker = make(tmp_path, WORKER)
    assert isinstance(worker, Worker) and not worker.checks_engine_args
    with pytest.raises(Rejected) as e:
        worker.refuse_request("restart")
    assert e.value.code == "worker" and "10.0.0.1" in str(e.value)
    assert worker.take_order(GEN, "demo-cluster", True, engine_alive=False) is False
    assert asyncio.run(worker.before_start("demo")) == Go("demo-cluster", ordered=True)
    assert worker.generation == GEN
    # The same generation again is no reason to end the running engine; another one or a stop is.
    assert worker.take_order(GEN, "demo-cluster", True, engine_alive=True) is False
    assert worker.take_order("b" * 12, "demo-cluster", True, engine_alive=True) is True
    assert worker.take_order(GEN, "demo-cluster", False, engine_alive=True) is True


def test_a_command_ends_the_workers_wait_for_the_head(tmp_path):
    worker = make(tmp_path, WORKER)

    async def go():
        waiting = asyncio.create_task(worker.before_start("demo"))
        await asyncio.sleep(0.01)
        worker.commands.put(Command(CommandKind.STOP))
        return await waiting

    assert asyncio.run(go()) == Interrupted("waiting for the head")


def test_the_worker_records_its_half_ending_and_leaves_the_restart_to_the_head(tmp_path):
    worker = make(tmp_path, WORKER)
    assert worker.head_decides("engine exited with code 1") is True
    node = worker.status(State.STARTING, "demo-cluster", None, "engine exited with code 1").node
    assert (node.role, node.error, node.engine_pid) == ("worker", "engine exited with code 1", None)
    assert make(tmp_path, HEAD).head_decides("engine exited with code 1") is False


def test_the_worker_ends_its_half_after_the_head_is_unreachable_three_times(tmp_path):
    worker = make(tmp_path, WORKER)
    worker.generation = GEN
    worker.head = StandInPeer("head admin API does not answer", expect="head")
    faults = [asyncio.run(worker.fault(loading=False)) for _ in range(cluster.UNREACHABLE_AFTER)]
    assert faults[:-1] == [None] * (cluster.UNREACHABLE_AFTER - 1)
    assert faults[-1] == "head unreachable 3 times in a row: head admin API does not answer"
    worker.head = StandInPeer({"role": "head", "generation": "b" * 12})
    assert asyncio.run(worker.fault(loading=False)) == f"the head runs generation {'b' * 12}, not {GEN}"


def test_the_head_counts_unreachable_polls_in_a_row_only(tmp_path):
    """Two misses, an answer, two misses: no fault (the count starts again); a third miss in a row is one."""
    head = make(tmp_path, HEAD)
    head.generation = GEN
    miss = "worker admin API does not answer"
    head.peer = StandInPeer(miss, miss, {"role": "worker", "generation": GEN, "joined": True}, miss, miss, miss)
    faults = [asyncio.run(head.fault(loading=False)) for _ in range(6)]
    assert faults[:5] == [None] * 5, faults
    assert faults[5] == f"worker unreachable 3 times in a row: {miss}"
    assert head.peer_view == miss  # the status page shows what the last poll got


def test_the_head_waits_for_the_worker_then_starts_a_new_generation_and_orders_it(tmp_path):
    head = make(tmp_path, HEAD)
    assert isinstance(head, Head)
    head.peer = peer = StandInPeer("worker admin API does not answer",
                                   {"role": "worker", "venv": cluster.venv_name(), "generation": None})
    go = asyncio.run(head.before_start("demo-cluster"))
    assert go == Go("demo-cluster") and head.generation is not None
    assert asyncio.run(head.after_spawn("demo-cluster")) is None
    assert peer.orders == [(head.generation, "demo-cluster", True)]
    assert not head.peer_joined()  # the worker has not reported this generation yet
    head.peer_view = {"role": "worker", "generation": head.generation, "joined": True}
    assert head.peer_joined()
    asyncio.run(head.after_stop("demo-cluster"))
    assert peer.orders[-1] == (head.generation, "demo-cluster", False)
    st = head.status(State.READY, "demo-cluster", None, None)
    assert st is not None and st.peer_address == "10.0.0.2" and st.generation == head.generation


def test_the_head_refuses_a_worker_on_another_venv_and_bounds_its_wait(tmp_path):
    head = make(tmp_path, HEAD)
    head.peer = StandInPeer({"role": "worker", "venv": "other-venv"})
    got = asyncio.run(head.before_start("demo-cluster"))
    assert isinstance(got, NotStarted) and got.requirement and "runs venv other-venv" in got.reason
    # A clock 10 s further at each reading, timeouts.load 5: one look at the worker, then the wait is over.
    head = make(tmp_path, HEAD, clock=itertools.count(0, 10).__next__, load=5)
    head.peer = StandInPeer("worker admin API does not answer")
    got = asyncio.run(head.before_start("demo-cluster"))
    assert got == NotStarted("worker admin API does not answer for timeouts.load=5 s")
