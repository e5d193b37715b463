"""The alert vocabulary, spelled once: the events an alert names, and the GPU episode kinds.

Its own module with no imports, so the settings (config.py: gpu.alerts), the throttle watch
(throttle.py, which needs NVML) and the alerter (alerts.py) share it without importing each other.
Adding a GPU kind: a member of `GpuAlertKind`, its `AlertEvent`, and its condition and wording in
throttle.py.
"""

from __future__ import annotations

from enum import StrEnum


class AlertEvent(StrEnum):
    """The `event` of an alert's JSON document (docs/OPERATIONS.md)."""

    GAVE_UP = "gave_up"
    MEMORY_GUARD = "memory_guard"
    WEDGED = "wedged"
    GPU_THERMAL = "gpu_thermal"
    GPU_POWER = "gpu_power"
    GPU_HW_SLOWDOWN = "gpu_hw_slowdown"
    GPU_CLOCK_LOW = "gpu_clock_low"


class GpuAlertKind(StrEnum):
    """A kind of GPU throttle episode (throttle.py), as gpu.alerts names it."""

    THERMAL = "thermal"
    POWER = "power"
    HW_SLOWDOWN = "hw_slowdown"
    LOW_CLOCK = "low_clock"

    @property
    def event(self) -> AlertEvent:
        return _EVENT_OF[self]


_EVENT_OF = {GpuAlertKind.THERMAL: AlertEvent.GPU_THERMAL, GpuAlertKind.POWER: AlertEvent.GPU_POWER,
             GpuAlertKind.HW_SLOWDOWN: AlertEvent.GPU_HW_SLOWDOWN, GpuAlertKind.LOW_CLOCK: AlertEvent.GPU_CLOCK_LOW}
