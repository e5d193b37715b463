"""The supervisor's published status: one frozen snapshot for the admin API, /metrics and the CLI.

Supervisor.status() takes it at one instant; readers never look at the
supervisor's attributes, so the JSON of /admin/status, /admin/profile and the
numbers of /metrics rendered from one snapshot agree with each other.

The to_json methods give the admin API's JSON (docs/ADMIN.md names its
fields; scripts and tests rely on them, so the shapes do not change). The CLI
parses that JSON back with the enums here (parse_state, OperationView.from_json)
instead of comparing bare strings. This module imports only the light parts of
the service (states, store, memory, profiles), so the CLI can use it without
loading the supervisor.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from .memory import MemoryReading
from .profiles import Profile
from .states import State, Transition
from .store import PersistedState

if TYPE_CHECKING:
    from .telemetry import TelemetrySnapshot


class CommandKind(str, enum.Enum):
    STOP = "stop"
    RESTART = "restart"
    SWITCH = "switch"


class OpStatus(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def in_progress(self) -> bool:
        return self in (OpStatus.PENDING, OpStatus.RUNNING)


class StatusFormatError(ValueError):
    """The admin API's JSON has a value this version does not know (a service of another version)."""


def _enum(cls: type[enum.Enum], value: Any, what: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        known = ", ".join(m.value for m in cls)
        raise StatusFormatError(f"the service answered {what} {value!r}, not one of {known}; "
                                "is this CLI the same version as the service?") from None


def parse_state(value: Any) -> State:
    """A state from the admin API's JSON (StatusFormatError if this version does not know it)."""
    return _enum(State, value, "state")


@dataclass(frozen=True)
class OperationView:
    """A restart or switch as it stood at the snapshot (the supervisor's Operation goes on changing)."""

    id: str
    kind: CommandKind
    target: str | None
    from_profile: str | None
    status: OpStatus
    error: str | None
    rolled_back_to: str | None
    created: float
    finished: float | None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind.value, "target": self.target, "from": self.from_profile,
                "status": self.status.value, "error": self.error, "rolled_back_to": self.rolled_back_to,
                "created": self.created, "finished": self.finished}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "OperationView":
        return cls(id=data["id"], kind=_enum(CommandKind, data["kind"], "operation kind"),
                   target=data.get("target"), from_profile=data.get("from"),
                   status=_enum(OpStatus, data["status"], "operation status"), error=data.get("error"),
                   rolled_back_to=data.get("rolled_back_to"), created=data.get("created", 0.0),
                   finished=data.get("finished"))


@dataclass(frozen=True)
class EngineStatus:
    pid: int | None               # None unless the engine process is alive
    url: str | None               # the engine's base URL, while there is an engine object
    ready_seconds: float | None   # how long it has been ready; None unless the state is ready


@dataclass(frozen=True)
class Counters:
    restarts: int          # backoff retries after failures, since start
    recent_failures: int   # failures inside restart.window (the give-up count)
    switches_ok: int
    switches_failed: int


@dataclass(frozen=True)
class GuardStatus:
    reading: MemoryReading | None  # the memory guard's last reading; None before the first
    trips: int                     # times it stopped the engine
    host_total_bytes: int          # the host's memory (the last reading's, or one read for this snapshot)


@dataclass(frozen=True)
class NodeStatus:
    """This node's half of a two-node engine, as the other node's supervisor reads it (GET /admin/cluster)."""

    role: str
    address: str | None
    state: State
    profile: str | None
    generation: str | None
    engine_pid: int | None
    joined: bool
    error: str | None       # why this node's half of the generation ended
    last_error: str | None
    venv: str

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "address": self.address, "state": self.state.value, "profile": self.profile,
                "generation": self.generation, "engine_pid": self.engine_pid, "joined": self.joined,
                "error": self.error, "last_error": self.last_error, "venv": self.venv}


@dataclass(frozen=True)
class ClusterStatus:
    """Both nodes on the head (the worker as last polled), this node and its head's URL on the worker."""

    node: NodeStatus
    peer_url: str                  # the other node's admin API
    generation: str | None
    peer_address: str | None       # head only: the worker's link address
    peer: Mapping[str, Any] | str | None = None  # head only: the worker's last answer, or why there was none

    def to_json(self) -> dict[str, Any]:
        me = self.node.to_json()
        if self.node.role == "worker":
            return {"role": "worker", "head": self.peer_url, "generation": self.generation, "nodes": [me]}
        peer = self.peer
        worker = ({"role": "worker", "address": self.peer_address, "reachable": False, "error": peer}
                  if isinstance(peer, str) or peer is None else {**peer, "reachable": True})
        return {"role": "head", "worker": self.peer_url, "generation": self.generation, "nodes": [me, worker]}


@dataclass(frozen=True)
class StartStatus:
    """Engine starts (startup.py): the one under way, the last one whole, and histograms per phase."""
    current: Mapping[str, Any] | None     # {"phase", "seconds", "phases"} while starting or loading
    last: Mapping[str, Any] | None        # StartupRecord.to_json() of the last start, ready or not
    histograms: Mapping[str, Any]         # phase -> (bucket bounds, cumulative counts, sum, count)

    def to_json(self) -> dict[str, Any]:
        return {"current": self.current, "last": self.last}


@dataclass(frozen=True)
class SupervisorStatus:
    """Everything the supervisor tells the outside, at one instant."""

    state: State
    profile: str | None                     # the profile running, starting or last run
    engine: EngineStatus
    started_at: float                       # unix time the supervisor started
    uptime_seconds: float
    last_error: str | None
    counters: Counters
    guard: GuardStatus
    operation: OperationView | None         # the latest restart/switch, running or ended
    operations: Mapping[str, OperationView]  # the last 50 by id
    transitions: tuple[Transition, ...]     # the last 50
    state_seconds: Mapping[State, float]    # time spent in each state since start
    profiles: Mapping[str, Profile]         # the loaded set
    saved: PersistedState                   # what state.json holds now
    cluster: ClusterStatus | None           # None on a single node
    start: StartStatus | None = None        # None only in snapshots made by hand (tests)
    telemetry: "TelemetrySnapshot | None" = None  # the sampler's last sample (telemetry.py); None before it

    @property
    def ready(self) -> bool:
        return self.state == State.READY

    def memory_json(self) -> dict[str, Any] | None:
        mem = self.guard.reading
        return None if mem is None else {
            "available_gib": round(mem.available_gib, 2), "total_gib": round(mem.total_bytes / 2**30, 2),
            "psi_some_avg10": mem.psi_some_avg10, "guard_trips": self.guard.trips}

    def to_json(self) -> dict[str, Any]:
        """GET /admin/status's body, less the version the app adds."""
        return {
            "state": self.state.value,
            "profile": self.profile,
            "engine_pid": self.engine.pid,
            "engine_url": self.engine.url,
            "uptime_seconds": self.uptime_seconds,
            "ready_seconds": self.engine.ready_seconds,
            "restarts": self.counters.restarts,
            "recent_failures": self.counters.recent_failures,
            "last_error": self.last_error,
            "memory": self.memory_json(),
            "switches": {"ok": self.counters.switches_ok, "failed": self.counters.switches_failed},
            "operation": self.operation.to_json() if self.operation else None,
            "transitions": [
                {"at": t.wall, "from": t.old.value, "to": t.new.value, "reason": t.reason, "profile": t.profile}
                for t in self.transitions],
            "cluster": self.cluster.to_json() if self.cluster else None,
            "telemetry": self.telemetry.to_json() if self.telemetry else None,
            "saved": {"active_profile": self.saved.active_profile,
                      "last_good_profile": self.saved.last_good_profile},
            "start": self.start.to_json() if self.start else None,
        }


def frozen_map(d: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """A read-only copy: a snapshot must not change under its reader."""
    return MappingProxyType(dict(d))
