"""Persisted state: which profile is active and which last reached ready.

Survives restarts and reboots. Written atomically (temp file in the same dir,
fsync, rename, fsync dir) so a crash or power cut leaves the old or the new
file, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("gptoss_spark.state")


@dataclass(frozen=True)
class PersistedState:
    active_profile: str | None = None
    last_good_profile: str | None = None


class StateStore:
    def __init__(self, path: Path):
        self.path = path

    def load(self) -> PersistedState:
        try:
            data = json.loads(self.path.read_text())
            return PersistedState(active_profile=data.get("active_profile"),
                                  last_good_profile=data.get("last_good_profile"))
        except FileNotFoundError:
            return PersistedState()
        except (OSError, ValueError, AttributeError) as e:
            # A damaged state file must not keep the service down: start from defaults, say so.
            log.warning("state file unreadable, using defaults", path=str(self.path), reason=str(e))
            return PersistedState()

    def save(self, state: PersistedState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".state.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(state), f, indent=2, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
