"""Memory guard for unified memory.

On a DGX Spark CPU and GPU share 128 GB; running out does not end in a clean
OOM kill but freezes the host (docs/HARDWARE.md). So the supervisor refuses to
start an engine that would not fit, and stops a running one before the host
reaches the edge. Readings come from an injectable source so tests can drive it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .budget import MemoryBudget
from .config import MemorySettings

GIB = 1024 ** 3


@dataclass(frozen=True)
class MemoryReading:
    available_bytes: int
    total_bytes: int
    psi_some_avg10: float | None  # None where the kernel has no PSI

    @property
    def available_gib(self) -> float:
        return self.available_bytes / GIB


class MemorySource(Protocol):
    def read(self) -> MemoryReading: ...


class ProcMemorySource:
    """Reads /proc/meminfo and /proc/pressure/memory."""

    def __init__(self, proc: Path = Path("/proc")):
        self.proc = proc

    def read(self) -> MemoryReading:
        fields: dict[str, int] = {}
        for line in (self.proc / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                fields[key] = int(parts[0]) * 1024
        return MemoryReading(fields["MemAvailable"], fields["MemTotal"], self._psi())

    def _psi(self) -> float | None:
        try:
            text = (self.proc / "pressure" / "memory").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("some "):
                for item in line.split()[1:]:
                    k, _, v = item.partition("=")
                    if k == "avg10":
                        return float(v)
        return None


class MemoryGuard:
    def __init__(self, settings: MemorySettings, source: MemorySource, budget: MemoryBudget | None = None):
        self.settings = settings
        self.source = source
        self.budget = budget  # the claims of the other services on this host (budget.py); None: this one only
        self.trips = 0
        self.last: MemoryReading | None = None

    def read(self) -> MemoryReading:
        self.last = self.source.read()
        return self.last

    def start_refusal(self, needed_gib: float, *, profile: str | None = None, profile_gib: float | None = None,
                      claim: bool = False) -> str | None:
        """Why an engine needing needed_gib more must not start now, or None if it may. With a budget, the
        profile's whole memory_gib (profile_gib) plus the other services' claims must fit in MemTotal
        first; claim=True then records this service's claim (the start goes ahead). The check and the
        claim are one step under the budget's lock: another service's check waits until this claim is
        written, and counts it."""
        if self.budget is None or profile is None:
            return self._available_refusal(self.read(), needed_gib)
        full = needed_gib if profile_gib is None else profile_gib
        with self.budget.locked():
            r = self.read()
            refusal = (self.budget.refusal(profile, full, self.settings.start_floor_gib, r.total_bytes / GIB)
                       or self._available_refusal(r, needed_gib))
            if refusal is None and claim:
                self.budget.claim(profile, full)
        return refusal

    def _available_refusal(self, r: MemoryReading, needed_gib: float) -> str | None:
        if r.available_gib < needed_gib + self.settings.start_floor_gib:
            return (f"only {r.available_gib:.1f} GiB available, the profile needs {needed_gib:g} GiB "
                    f"+ {self.settings.start_floor_gib:g} GiB floor; free memory or lower memory.start_floor_gib")
        return None

    def danger(self) -> str | None:
        """Why the running engine must be stopped now to save the host, or None."""
        r = self.read()
        if r.available_gib < self.settings.danger_available_gib:
            self.trips += 1
            return (f"MemAvailable {r.available_gib:.2f} GiB below the danger line "
                    f"{self.settings.danger_available_gib:g} GiB")
        if r.psi_some_avg10 is not None and r.psi_some_avg10 > self.settings.danger_psi_some_avg10:
            self.trips += 1
            return (f"memory pressure (PSI some avg10) {r.psi_some_avg10:.1f}% above "
                    f"{self.settings.danger_psi_some_avg10:g}%")
        return None
