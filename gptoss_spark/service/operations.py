"""Requests from outside the supervisor's loop: typed commands, the one slot they wait in, operations.

SIGHUP, SIGTERM, the admin API and the head's orders never touch the engine: the supervisor
validates a request, then puts a Command into the CommandQueue's one slot and the run loop takes
it at its next safe point. A restart or switch also gets an Operation, which anyone can poll
until it ends; the queue keeps the last OPERATIONS_KEPT of them for the status.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Mapping

from .profiles import Profile
from .status import CommandKind, OperationView, OpStatus

OPERATIONS_KEPT = 50


@dataclass
class Operation:
    """A restart or profile switch asked for from outside, to poll until it ends."""

    kind: CommandKind
    target: str | None
    from_profile: str | None
    id: str = field(default_factory=lambda: secrets.token_hex(6))
    status: OpStatus = OpStatus.PENDING
    error: str | None = None
    rolled_back_to: str | None = None
    created: float = field(default_factory=time.time)
    finished: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def finish(self, ok: bool, error: str | None = None) -> None:
        self.status = OpStatus.SUCCEEDED if ok else OpStatus.FAILED
        self.error = error
        self.finished = time.time()
        self.done.set()

    def view(self) -> OperationView:
        """The operation as it stands now, frozen (what the admin API and the status show)."""
        return OperationView(self.id, self.kind, self.target, self.from_profile, self.status, self.error,
                             self.rolled_back_to, self.created, self.finished)


@dataclass
class Command:
    kind: CommandKind
    op: Operation | None = None
    # The target profile as validated when the command was accepted: vLLM's parser and the next
    # engine get this object, so the operation reads the profile files once (edits after that
    # need another restart).
    profile: Profile | None = None


class Rejected(Exception):
    """A request the supervisor refuses without changing anything. code: busy|unknown|invalid|unmet|memory|state|worker."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


class CommandQueue:
    """One slot for the next command, the operation in progress, and the recent operations.

    Only the supervisor's loop takes commands (take, wait); the rest is read-only views."""

    def __init__(self) -> None:
        self._pending: Command | None = None
        self._current: Operation | None = None
        self._operations: dict[str, Operation] = {}
        self._order: list[str] = []
        # Set while a command waits in the slot: the loop's sleeps wake on it.
        self.wake = asyncio.Event()

    # ---- views -------------------------------------------------------------------------------

    @property
    def pending(self) -> Command | None:
        """The command waiting for the loop's next safe point, if any."""
        return self._pending

    @property
    def current(self) -> Operation | None:
        """The operation the loop last took (in progress until it is done)."""
        return self._current

    @property
    def operations(self) -> Mapping[str, Operation]:
        return self._operations

    def views(self) -> dict[str, OperationView]:
        """The kept operations, oldest first, frozen."""
        return {op_id: self._operations[op_id].view() for op_id in self._order if op_id in self._operations}

    # ---- the outside's side --------------------------------------------------------------------

    def ensure_idle(self) -> None:
        """Rejected("busy") while another operation waits or runs, or a stop waits."""
        if (self._current and not self._current.done.is_set()) or self._pending is not None:
            busy = self._current or (self._pending.op if self._pending else None)
            raise Rejected("busy", f"another operation is in progress ({busy.kind.value} {busy.id})"
                           if busy else "a stop is in progress")

    def new_operation(self, kind: CommandKind, target: str | None, from_profile: str | None) -> Operation:
        op = Operation(kind, target, from_profile)
        self._operations[op.id] = op
        self._order.append(op.id)
        while len(self._order) > OPERATIONS_KEPT:
            self._operations.pop(self._order.pop(0), None)
        return op

    def put(self, cmd: Command) -> None:
        # A stop outranks everything; anything else only enters an empty slot (checked by callers).
        if self._pending is None or cmd.kind == CommandKind.STOP:
            if self._pending and self._pending.op and cmd.kind == CommandKind.STOP:
                self._pending.op.finish(False, "cancelled: the service is stopping")
            self._pending = cmd
        self.wake.set()

    # ---- the loop's side ---------------------------------------------------------------------

    def take(self) -> Command | None:
        """Empty the slot; its operation is in progress from here until done (ensure_idle: busy)."""
        cmd, self._pending = self._pending, None
        self.wake.clear()
        if cmd is not None and cmd.op is not None:
            self._current = cmd.op
        return cmd

    async def wait(self, delay: float | None) -> Command | None:
        """The next command, or None after `delay` seconds (None: wait for one as long as it takes)."""
        try:
            await asyncio.wait_for(self.wake.wait(), delay)
        except asyncio.TimeoutError:
            return None
        return self.take()
