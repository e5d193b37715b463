"""Throttle episodes: when a GPU's slowdown is worth one alert, and when it is over.

Three kinds, per device:
- thermal: NVML's thermal slowdown reasons (sw_thermal, hw_thermal) active;
- power: the power cap or power brake (sw_power_cap, hw_power_brake) active;
- low_clock: requests are running and the SM clock is under low_clock_fraction of its norm
  (gpu.max_clock_mhz when the cap is set, else the device's maximum SM clock).

A condition that holds for alert_after seconds starts an episode and yields one alert with the
figures; the episode ends only after the condition has been clear for as long again, so a GPU
that flickers around its limit (or a pause between requests) does not page anyone twice.
Pure logic over readings and a clock: tests drive it with a fake clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from .gpu import POWER, THERMAL, GpuDevice, GpuReading

KINDS = ("thermal", "power", "low_clock")
EVENT = {"thermal": "gpu_thermal", "power": "gpu_power", "low_clock": "gpu_clock_low"}


@dataclass(frozen=True)
class EpisodeChange:
    """An episode that started (alert it) or ended (log it)."""

    kind: str
    device: int
    started: bool
    seconds: float       # how long the condition had held (started) or the episode lasted (ended)
    reason: str          # one line with the figures
    figures: dict[str, object]

    @property
    def event(self) -> str:
        return EVENT[self.kind]


@dataclass
class _Track:
    since: float | None = None        # condition true since
    clear_since: float | None = None  # condition false since (while in an episode)
    episode_start: float | None = None


def _figures(d: GpuDevice) -> dict[str, object]:
    return {"gpu": d.index, "temperature_c": d.temperature_c, "sm_clock_mhz": d.sm_clock_mhz,
            "max_sm_clock_mhz": d.max_sm_clock_mhz, "power_watts": d.power_watts,
            "power_limit_watts": d.power_limit_watts,
            "throttle": sorted(d.throttle) if d.throttle is not None else None}


def _describe(kind: str, d: GpuDevice, norm: float | None, seconds: float) -> str:
    parts = []
    if d.temperature_c is not None:
        parts.append(f"{d.temperature_c:g} C")
    if d.sm_clock_mhz is not None:
        parts.append(f"SM {d.sm_clock_mhz:g} MHz" + (f" of {norm:g}" if norm else ""))
    if d.power_watts is not None:
        parts.append(f"{d.power_watts:.0f} W" + (f" of {d.power_limit_watts:.0f} W" if d.power_limit_watts else ""))
    what = {"thermal": "thermal slowdown", "power": "power capping",
            "low_clock": "SM clock well below its norm while generating"}[kind]
    active = sorted((d.throttle or frozenset()) & (THERMAL | POWER))
    why = f" ({', '.join(active)})" if active else ""
    return f"GPU {d.index}: {what}{why} for {seconds:.0f} s: {', '.join(parts) or 'no figures'}"


class ThrottleWatch:
    def __init__(self, alert_after: float, low_clock_fraction: float, cap_mhz: int = 0,
                 clock: Callable[[], float] = time.monotonic):
        self.alert_after = alert_after
        self.low_clock_fraction = low_clock_fraction
        self.cap_mhz = cap_mhz
        self.clock = clock
        self._tracks: dict[tuple[str, int], _Track] = {}

    def norm(self, d: GpuDevice) -> float | None:
        if self.cap_mhz and (d.max_sm_clock_mhz is None or self.cap_mhz < d.max_sm_clock_mhz):
            return float(self.cap_mhz)
        return d.max_sm_clock_mhz

    def _holds(self, kind: str, d: GpuDevice, generating: bool) -> bool:
        if kind == "thermal":
            return bool(d.throttle and d.throttle & THERMAL)
        if kind == "power":
            return bool(d.throttle and d.throttle & POWER)
        norm = self.norm(d)
        return (generating and norm is not None and d.sm_clock_mhz is not None
                and d.sm_clock_mhz < self.low_clock_fraction * norm)

    def active(self) -> list[tuple[str, int]]:
        """(kind, device) of the episodes going on now."""
        return sorted(k for k, t in self._tracks.items() if t.episode_start is not None)

    def observe(self, reading: GpuReading, generating: bool) -> list[EpisodeChange]:
        now = self.clock()
        changes: list[EpisodeChange] = []
        for d in reading.devices:
            for kind in KINDS:
                t = self._tracks.setdefault((kind, d.index), _Track())
                if self._holds(kind, d, generating):
                    t.clear_since = None
                    if t.since is None:
                        t.since = now
                    if t.episode_start is None and now - t.since >= self.alert_after:
                        t.episode_start = t.since
                        seconds = now - t.since
                        changes.append(EpisodeChange(kind, d.index, True, seconds,
                                                     _describe(kind, d, self.norm(d), seconds), _figures(d)))
                    continue
                t.since = None
                if t.episode_start is None:
                    continue
                if t.clear_since is None:
                    t.clear_since = now
                if now - t.clear_since >= self.alert_after:
                    lasted = t.clear_since - t.episode_start
                    changes.append(EpisodeChange(kind, d.index, False, lasted,
                                                 f"GPU {d.index}: {kind} episode over after {lasted:.0f} s",
                                                 _figures(d)))
                    t.episode_start = t.clear_since = None
        return changes
