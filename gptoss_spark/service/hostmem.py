"""Memory figures that mean something on unified memory, beyond the guard's MemAvailable and PSI.

On a GB10 the GPU allocates from the same 128 GB as the CPU and NVML reports device memory as
"Not Supported", so what the engine holds shows up in the host's own accounting: the unit's
cgroup (memory.current, which counts the engine's pinned and device allocations as the kernel sees
them) and the engine process tree's resident set. Each reader returns None where the figure does
not exist (cgroup v1, a process gone between listing and reading), never raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .memory import MemoryReading

PAGE_KIB = 1024


@dataclass(frozen=True)
class HostMemory:
    available_bytes: int | None
    total_bytes: int | None
    psi_some_avg10: float | None
    cgroup_bytes: int | None         # memory.current of the cgroup this process runs in (the unit's)
    cgroup: str | None               # that cgroup's path, for the reader
    engine_rss_bytes: int | None     # resident set of the engine's process tree; None without an engine

    def to_json(self) -> dict[str, Any]:
        return {"available_bytes": self.available_bytes, "total_bytes": self.total_bytes,
                "psi_some_avg10": self.psi_some_avg10, "cgroup_bytes": self.cgroup_bytes, "cgroup": self.cgroup,
                "engine_rss_bytes": self.engine_rss_bytes}


def own_cgroup(proc: Path = Path("/proc")) -> str | None:
    """This process's cgroup v2 path ("/system.slice/gptoss-spark.service"), or None (v1, no /proc)."""
    try:
        text = (proc / "self" / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def cgroup_memory_current(cgroup: str | None, root: Path = Path("/sys/fs/cgroup")) -> int | None:
    if cgroup is None:
        return None
    try:
        return int((root / cgroup.lstrip("/") / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None


def tree_rss_bytes(pids: Iterable[int], proc: Path = Path("/proc")) -> int | None:
    """Sum of VmRSS over pids (the engine's session: the engine and every child it made)."""
    total = 0
    seen = False
    for pid in pids:
        try:
            text = (proc / str(pid) / "status").read_text()
        except OSError:
            continue  # ended since it was listed
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * PAGE_KIB
                seen = True
                break
    return total if seen else None


def host_memory(guard_reading: MemoryReading | None, engine_pids: Iterable[int], cgroup: str | None,
                cgroup_root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")) -> HostMemory:
    pids = list(engine_pids)
    return HostMemory(
        available_bytes=guard_reading.available_bytes if guard_reading else None,
        total_bytes=guard_reading.total_bytes if guard_reading else None,
        psi_some_avg10=guard_reading.psi_some_avg10 if guard_reading else None,
        cgroup_bytes=cgroup_memory_current(cgroup, cgroup_root),
        cgroup=cgroup,
        engine_rss_bytes=tree_rss_bytes(pids, proc) if pids else None,
    )
