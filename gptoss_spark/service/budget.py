"""The memory budget of several services on one host: each claims its profile's memory_gib, and a start
is refused when the claims of the others plus its own (plus memory.start_floor_gib) exceed MemTotal.

Why claims and not MemAvailable alone: an engine that is still loading has not taken its memory yet,
so a second one started meanwhile would see it free, and on unified memory the two together freeze
the host (docs/HARDWARE.md). A claim is a file `<claims dir>/<service>.json` (the service: its unit,
gptoss-spark or gptoss-spark@NAME, instance.service_name; not its served name, which two instances
may share, and whose claims would then overwrite each other) naming the supervisor's pid and that
process's start time; it is written when an engine is let start and holds
while that supervisor may start one (an engine in backoff will start again). A supervisor that gave up
(`failed`) or was stopped on request (`stopped`) has no engine and starts none until asked: it stays up
for the admin API, so it releases its claim (written again at its next start). A claim whose process is gone
(or whose pid now belongs to another process) counts for nothing, so no cleanup is needed after a
crash or a reboot.

Checking and claiming happen under one lock (flock on `<claims dir>/.lock`): two supervisors started
together would otherwise both read the claims before either wrote its own, and both start. The lock
is held for a directory read and one small write; the holder's exit (even a crash) releases it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from ..base.fsutil import read_json, write_atomic


@dataclass(frozen=True)
class Claim:
    instance: str
    profile: str
    memory_gib: float


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


class MemoryBudget:
    def __init__(self, claims_dir: Path, instance: str, pid: int | None = None):
        self.dir = claims_dir
        self.instance = instance
        self.pid = pid or os.getpid()

    @property
    def own_file(self) -> Path:
        # Percent-encoded: one file per name, a state dir path included (its "/" cannot be in a file name).
        return self.dir / f"{quote(self.instance, safe='@._-')}.json"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the claims directory's lock: no other service checks or claims meanwhile. flock locks an
        open file description, so two MemoryBudgets exclude each other in one process too."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def others(self) -> list[Claim]:
        """The live claims of the other services, by name."""
        claims = []
        for path in sorted(self.dir.glob("*.json")):
            if path == self.own_file:
                continue
            try:
                data = read_json(path)
                live = _start_time(int(data["pid"])) == data["start_time"]
                claim = Claim(str(data["instance"]), str(data["profile"]), float(data["memory_gib"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if live:
                claims.append(claim)
        return claims

    def claim(self, profile: str, memory_gib: float) -> None:
        body = {"instance": self.instance, "profile": profile, "memory_gib": memory_gib, "pid": self.pid,
                "start_time": _start_time(self.pid)}
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.own_file, json.dumps(body).encode(), sync_dir=False)

    def release(self) -> bool:
        """Remove this service's claim if it is this process's; True when one was removed. A file of the
        same name written by another live process (a misconfigured twin with the same state dir) stays."""
        try:
            data = read_json(self.own_file)
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and data.get("pid") not in (None, self.pid):
            return False
        try:
            self.own_file.unlink()
        except FileNotFoundError:
            return False
        return True

    def refusal(self, profile: str, memory_gib: float, floor_gib: float, total_gib: float) -> str | None:
        """Why a start of `profile` must not happen with the others' claims; None if the sum fits."""
        others = self.others()
        total = sum(c.memory_gib for c in others) + memory_gib + floor_gib
        if not others or total <= total_gib:
            return None
        held = ", ".join(f"{c.instance} holds {c.memory_gib:g} GiB ({c.profile})" for c in others)
        terms = " + ".join(f"{c.memory_gib:g}" for c in others)
        return (f"{held}; {terms} + {memory_gib:g} ({profile}) + {floor_gib:g} floor = {total:g} GiB, more than "
                f"the host's {total_gib:.1f} GiB; stop a service or pick a smaller profile")
