"""This node's part in the engine: alone (Solo), or one of two nodes (Head, Worker; cluster.py).

The Supervisor asks its role at each point where the two-node protocol differs from one node:
before an engine starts (the worker waits for the head's order, the head for the worker), after
the engine was spawned (the head orders the worker's rank 1), while it loads and serves (each side
watches the other), when it stops (the head stops the worker's half), and when it ended on its own
(the worker leaves that to the head). Roles never change the supervisor's state: they return
what they found, and the Supervisor makes every transition.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import structlog

from . import cluster
from .operations import CommandQueue, Rejected
from .states import State
from .status import ClusterStatus, NodeStatus, frozen_map
from .systemd import EXTEND_EVERY_SECONDS, Notifier, StartJobKeeper

if TYPE_CHECKING:
    from .config import Settings
    from .engine import EngineProcess

# The supervisor's logger: these are the supervisor's events (journal readers filter on it).
log = structlog.get_logger("gptoss_spark.service.supervisor")

# How often the head asks whether the worker's supervisor answers yet.
PEER_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Go:
    """Start the engine for `profile`. ordered: the head named it, so this node's own files say what it is."""

    profile: str
    ordered: bool = False


@dataclass(frozen=True)
class Interrupted:
    """A command arrived while waiting for the other node (`while_` says for what)."""

    while_: str


@dataclass(frozen=True)
class NotStarted:
    """Why the engine cannot start now (requirement: no retry can help)."""

    reason: str
    requirement: bool = False


class Solo:
    """One node: nothing to wait for, nobody to tell. The base of Head and Worker."""

    name: str | None = None
    # vLLM's parser runs on the argv of a switch's or restart's target before the engine stops.
    checks_engine_args = True

    def __init__(self, settings: "Settings", commands: CommandQueue, notifier: Notifier,
                 clock: Callable[[], float]):
        self.settings = settings
        self.commands = commands
        self.notifier = notifier
        self.clock = clock
        # The generation both halves of a two-node engine share (cluster.py); None on one node.
        self.generation: str | None = None

    def refuse_request(self, what: str) -> None:
        """Rejected if this node does not take restarts and switches from outside."""

    def take_order(self, generation: str, profile: str, run: bool, engine_alive: bool) -> bool:
        raise AssertionError("only a cluster worker takes the head's orders")

    async def before_start(self, name: str) -> Go | Interrupted | NotStarted:
        return Go(name)

    def missing_profile(self, name: str) -> str:
        return f"profile {name} vanished"

    def own_probe(self, engine: "EngineProcess") -> Any | None:
        """A probe of this role's own, or None for the engine's HTTP probe."""
        return None

    async def after_spawn(self, name: str) -> str | None:
        """Once this node's engine process runs; a reason = loading cannot go on."""
        return None

    async def fault(self, *, loading: bool) -> str | None:
        """A reason to end this node's engine because of the other node; None = carry on."""
        return None

    def peer_joined(self) -> bool:
        return True

    def ready_reason(self, pid: int | None) -> str:
        return f"engine pid {pid} passed /health and the canary"

    async def after_stop(self, name: str) -> None:
        """Once this node's engine has stopped."""

    def head_decides(self, reason: str) -> bool:
        """An engine ended on its own: True = the head decides what follows (this node only records why)."""
        return False

    def status(self, state: State, profile: str | None, engine: "EngineProcess | None",
               last_error: str | None) -> ClusterStatus | None:
        return None

    def _node_status(self, state: State, profile: str | None, engine: "EngineProcess | None",
                     last_error: str | None, error: str | None) -> NodeStatus:
        assert self.name is not None and self.settings.cluster is not None
        alive = engine is not None and engine.returncode is None
        return NodeStatus(role=self.name, address=str(self.settings.cluster.address), state=state,
                          profile=profile, generation=self.generation,
                          engine_pid=engine.pid if alive else None,
                          joined=bool(alive and engine.joined_at is not None), error=error,
                          last_error=last_error, venv=cluster.venv_name())


class Head(Solo):
    """Rank 0 and the API: owns the restart policy for both nodes, orders and watches the worker."""

    name = "head"

    def __init__(self, settings: "Settings", commands: CommandQueue, notifier: Notifier,
                 clock: Callable[[], float]):
        super().__init__(settings, commands, notifier, clock)
        self.peer = cluster.PeerClient(settings)
        self.peer_view: dict[str, Any] | str | None = None  # the worker's last answer, or why there was none

    async def before_start(self, name: str) -> Go | Interrupted | NotStarted:
        """Wait until the worker's supervisor answers and runs the same venv; then a new generation.

        Not counted as a failure while it lasts (the worker may boot later), bounded by timeouts.load."""
        deadline = self.clock() + self.settings.timeouts.load
        start_job = StartJobKeeper(self.notifier, self.clock)
        said = None
        while True:
            if self.commands.pending is not None:
                return Interrupted("waiting for the worker")
            view = await self.peer.node(self.settings.timeouts.probe_timeout)
            self.peer_view = view
            if isinstance(view, dict):
                if view.get("venv") != cluster.venv_name():
                    return NotStarted(
                        f"the worker runs venv {view.get('venv')}, this head {cluster.venv_name()}: install the "
                        f"same version on both nodes (docs/CLUSTER.md)", requirement=True)
                self.generation = cluster.new_generation()
                return Go(name)
            if view != said:
                log.warning("waiting for the worker", reason=view, profile=name)
                said = view
            now = self.clock()
            if now >= deadline:
                return NotStarted(f"{view} for timeouts.load={self.settings.timeouts.load:g} s")
            start_job.progress()
            wake = asyncio.create_task(self.commands.wake.wait())
            try:
                await asyncio.wait({wake}, timeout=PEER_POLL_SECONDS)
            finally:
                wake.cancel()

    async def after_spawn(self, name: str) -> str | None:
        # Rank 0 first (it hosts vLLM's TCPStore on master_port), then the worker's rank 1.
        refused = await self.peer.order(self.generation or "", name, True, self.settings.timeouts.probe_timeout)
        if refused:
            return refused
        self.peer.failures = 0
        return None

    async def fault(self, *, loading: bool) -> str | None:
        """Poll the worker; a reason when its half of this generation is gone or unreachable."""
        view, unreachable = await self.peer.watch(self.settings.timeouts.probe_timeout)
        self.peer_view = view
        if isinstance(view, str):
            return unreachable
        return cluster.worker_fault(view, self.generation, loading=loading)

    def peer_joined(self) -> bool:
        return cluster.worker_joined(self.peer_view, self.generation)

    def ready_reason(self, pid: int | None) -> str:
        return f"engine pid {pid} passed /health and the canary, the worker joined (generation {self.generation})"

    async def after_stop(self, name: str) -> None:
        if self.generation is None:
            return
        # The worker's rank 1 outlives rank 0 and cannot join the next engine: it goes too.
        refused = await self.peer.order(self.generation, name, False, self.settings.timeouts.probe_timeout)
        if refused:
            log.warning("could not tell the worker to stop its half", reason=refused, generation=self.generation)

    def status(self, state: State, profile: str | None, engine: "EngineProcess | None",
               last_error: str | None) -> ClusterStatus | None:
        assert self.settings.cluster is not None
        peer = self.peer_view
        return ClusterStatus(node=self._node_status(state, profile, engine, last_error, None),
                             peer_url=self.settings.peer_admin_url, generation=self.generation,
                             peer_address=str(self.settings.cluster.peer),
                             peer=frozen_map(peer) if isinstance(peer, dict) else peer)


class Worker(Solo):
    """Rank 1, headless: starts an engine only on the head's order and watches the head."""

    name = "worker"
    checks_engine_args = False  # the worker's argv is the head's business (its parser runs there)

    def __init__(self, settings: "Settings", commands: CommandQueue, notifier: Notifier,
                 clock: Callable[[], float]):
        super().__init__(settings, commands, notifier, clock)
        self.orders = cluster.WorkerOrders()
        # A head that is gone for good (powered off, cable out) sends no stop: the worker watches it.
        self.head = cluster.PeerClient(settings, expect="head")
        self.generation_error: str | None = None  # why this node's half of the generation ended

    def refuse_request(self, what: str) -> None:
        raise Rejected("worker", f"this node is the cluster's worker: {what} on the head "
                                 f"({self.settings.peer_admin_url}), which drives both nodes")

    def take_order(self, generation: str, profile: str, run: bool, engine_alive: bool) -> bool:
        """Note the head's order; True = the running engine must end now (told to stop, or another generation)."""
        log.info("order from the head", generation=generation, profile=profile, run=run)
        self.orders.give(generation, profile, run)
        return engine_alive and (not run or generation != self.generation)

    async def before_start(self, name: str) -> Go | Interrupted | NotStarted:
        """Wait for the head's order to run a generation this node has not run yet."""
        start_job = StartJobKeeper(self.notifier, self.clock)
        while True:
            if self.commands.pending is not None:
                return Interrupted("waiting for the head")
            o = self.orders.latest
            if o.run and o.generation != self.generation and o.profile:
                self.generation, self.generation_error = o.generation, None
                self.head.failures = 0
                log.info("starting rank 1 on the head's order", generation=o.generation, profile=o.profile)
                return Go(o.profile, ordered=True)
            start_job.progress()  # waiting for the head is progress too
            self.orders.changed.clear()
            waits = {asyncio.create_task(self.orders.changed.wait()), asyncio.create_task(self.commands.wake.wait())}
            try:
                await asyncio.wait(waits, timeout=EXTEND_EVERY_SECONDS, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    def missing_profile(self, name: str) -> str:
        return f"profile {name} is not among this node's profiles"

    def own_probe(self, engine: "EngineProcess") -> cluster.JoinProbe:
        return cluster.JoinProbe(engine)

    async def fault(self, *, loading: bool) -> str | None:
        """A reason to end rank 1 when the head is unreachable or has moved to another generation."""
        view, unreachable = await self.head.watch(self.settings.timeouts.probe_timeout)
        if isinstance(view, str):
            return unreachable
        return cluster.head_fault(view, self.generation)

    def ready_reason(self, pid: int | None) -> str:
        return f"engine pid {pid} joined the head (generation {self.generation})"

    def head_decides(self, reason: str) -> bool:
        # The head owns restarts (cluster.py): report why this half ended and wait for its order.
        self.generation_error = reason
        return True

    def status(self, state: State, profile: str | None, engine: "EngineProcess | None",
               last_error: str | None) -> ClusterStatus | None:
        return ClusterStatus(node=self._node_status(state, profile, engine, last_error, self.generation_error),
                             peer_url=self.settings.peer_admin_url, generation=self.generation,
                             peer_address=None, peer=None)


def role_for(settings: "Settings", commands: CommandQueue, notifier: Notifier,
             clock: Callable[[], float]) -> Solo:
    """The role [cluster] gives this node: Solo without one."""
    kind = {"head": Head, "worker": Worker}.get(settings.cluster.role) if settings.cluster else Solo
    assert kind is not None, settings.cluster
    return kind(settings, commands, notifier, clock)
