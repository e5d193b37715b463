"""Persisted state: which profile is active and which last reached ready.

Survives restarts and reboots. Written atomically (temp file in the same dir,
fsync, rename, fsync dir) so a crash or power cut leaves the old or the new
file, never half of one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from ..base.fsutil import read_json, write_atomic

log = structlog.get_logger("gptoss_spark.service.store")


@dataclass(frozen=True)
class PersistedState:
    active_profile: str | None = None
    last_good_profile: str | None = None


class StateStore:
    def __init__(self, path: Path):
        self.path = path
        self._known: PersistedState | None = None  # what the last load or save saw

    def current(self) -> PersistedState:
        """What state.json holds, without reading it again: the supervisor is its one writer
        while it runs, so the last load or save is the file. The status snapshot, taken on every
        /admin/health poll, reads this instead of the disk."""
        return self._known if self._known is not None else self.load()

    def load(self) -> PersistedState:
        try:
            data = read_json(self.path)
            state = PersistedState(active_profile=data.get("active_profile"),
                                   last_good_profile=data.get("last_good_profile"))
        except FileNotFoundError:
            state = PersistedState()
        except (OSError, ValueError, AttributeError) as e:
            # A damaged state file must not keep the service down: start from defaults, say so.
            log.warning("state file unreadable, using defaults", path=str(self.path), reason=str(e))
            state = PersistedState()
        self._known = state
        return state

    def save(self, state: PersistedState) -> None:
        write_atomic(self.path, (json.dumps(asdict(state), indent=2, sort_keys=True) + "\n").encode())
        self._known = state
