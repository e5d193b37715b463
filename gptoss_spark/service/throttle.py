"""Throttle episodes: when a GPU's slowdown is worth one alert, and when it is over.

Four kinds, per device:
- thermal: NVML's thermal slowdown reasons (sw_thermal, hw_thermal) active;
- power: the hardware power brake (hw_power_brake) active, or the power cap (sw_power_cap) active
  while the SM clock is at or under power_clock_fraction of its norm. A GPU under load runs at its
  power limit by design (an H200 under a plain matmul reported sw_power_cap within seconds, at
  641 of 700 W and 87% of its maximum clock): the cap alone is the GPU working as meant, so it
  counts only when it costs clock. Where NVML gives no clock, the cap alone counts;
- hw_slowdown: NVML's generic hardware slowdown (hw_slowdown: clocks cut by half or more) with
  neither hw_thermal nor hw_power_brake to name its cause: an external power brake (a Spark's
  power supply), over-current protection. Its own kind, because it is neither provably thermal
  nor the power cap, and it is never normal;
- low_clock: requests are running and the SM clock is at or under low_clock_fraction of its norm
  (gpu.max_clock_mhz when the cap is set, else the device's maximum SM clock).

A condition that holds for alert_after seconds starts an episode; the episode ends only after the
condition has been clear for as long again, so a GPU that flickers around its limit (or a pause
between requests) does not page anyone twice. Every episode is tracked and shown (status,
/metrics); only the kinds in `alerts` (gpu.alerts) carry an alert, once per episode, with the
figures. Pure logic over readings and a clock: tests drive it with a fake clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Collection

from .alert_kinds import AlertEvent, GpuAlertKind
from .gpu import POWER, THERMAL, GpuDevice, GpuReading

# Hardware slowdown reasons that name their cause: with one of these, hw_slowdown is that kind's.
_EXPLAINED_HW = frozenset({"hw_thermal", "hw_power_brake"})


@dataclass(frozen=True)
class EpisodeChange:
    """An episode that started (alert it) or ended (log it)."""

    kind: GpuAlertKind
    device: int
    started: bool
    seconds: float       # how long the condition had held (started) or the episode lasted (ended)
    reason: str          # one line with the figures
    figures: dict[str, object]
    alert: bool = False  # a started episode of a kind in gpu.alerts: send the alert

    @property
    def event(self) -> AlertEvent:
        return self.kind.event


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
    what = {"thermal": "thermal slowdown", "power": "power capping that costs clock",
            "hw_slowdown": "hardware slowdown (power supply brake or over-current)",
            "low_clock": "SM clock well below its norm while generating"}[kind]
    active = sorted((d.throttle or frozenset()) & (THERMAL | POWER | {"hw_slowdown"}))
    why = f" ({', '.join(active)})" if active else ""
    return f"GPU {d.index}: {what}{why} for {seconds:.0f} s: {', '.join(parts) or 'no figures'}"


class ThrottleWatch:
    def __init__(self, alert_after: float, low_clock_fraction: float, cap_mhz: int = 0,
                 clock: Callable[[], float] = time.monotonic, power_clock_fraction: float = 0.8,
                 alerts: Collection[str] = tuple(GpuAlertKind)):
        unknown = set(alerts) - set(GpuAlertKind)
        if unknown:  # config.py validates gpu.alerts; this guards a caller that bypasses it
            raise ValueError(f"unknown throttle kinds {sorted(unknown)}: known are {', '.join(GpuAlertKind)}")
        self.alert_after = alert_after
        self.low_clock_fraction = low_clock_fraction
        self.power_clock_fraction = power_clock_fraction
        self.cap_mhz = cap_mhz
        self.clock = clock
        self.alerts = frozenset(GpuAlertKind(a) for a in alerts)
        self._tracks: dict[tuple[str, int], _Track] = {}

    def norm(self, d: GpuDevice) -> float | None:
        if self.cap_mhz and (d.max_sm_clock_mhz is None or self.cap_mhz < d.max_sm_clock_mhz):
            return float(self.cap_mhz)
        return d.max_sm_clock_mhz

    def _at_or_under(self, fraction: float, d: GpuDevice) -> bool | None:
        """Whether the SM clock is at or under `fraction` of its norm; None when NVML gives no clock.
        At exactly the fraction counts: the setting names the clock that is already too low."""
        norm = self.norm(d)
        if norm is None or d.sm_clock_mhz is None:
            return None
        return d.sm_clock_mhz <= fraction * norm

    def _holds(self, kind: str, d: GpuDevice, generating: bool) -> bool:
        reasons = d.throttle or frozenset()
        if kind == "thermal":
            return bool(reasons & THERMAL)
        if kind == "power":
            if "hw_power_brake" in reasons:
                return True  # a hardware brake is never the normal state
            if "sw_power_cap" not in reasons:
                return False
            costs = self._at_or_under(self.power_clock_fraction, d)
            return costs is None or costs
        if kind == "hw_slowdown":
            return "hw_slowdown" in reasons and not reasons & _EXPLAINED_HW
        return generating and bool(self._at_or_under(self.low_clock_fraction, d))

    def active(self) -> list[tuple[str, int]]:
        """(kind, device) of the episodes going on now."""
        return sorted(k for k, t in self._tracks.items() if t.episode_start is not None)

    def observe(self, reading: GpuReading, generating: bool) -> list[EpisodeChange]:
        now = self.clock()
        changes: list[EpisodeChange] = []
        for d in reading.devices:
            for kind in GpuAlertKind:
                t = self._tracks.setdefault((kind, d.index), _Track())
                if self._holds(kind, d, generating):
                    t.clear_since = None
                    if t.since is None:
                        t.since = now
                    if t.episode_start is None and now - t.since >= self.alert_after:
                        t.episode_start = t.since
                        seconds = now - t.since
                        changes.append(EpisodeChange(kind, d.index, True, seconds,
                                                     _describe(kind, d, self.norm(d), seconds), _figures(d),
                                                     alert=kind in self.alerts))
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
