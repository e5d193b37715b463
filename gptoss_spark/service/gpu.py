"""The GPU as NVML reports it: temperature, clocks, power, utilization, throttle reasons, memory.

Read through nvidia-ml-py (`import pynvml`, pure Python over the driver's
libnvidia-ml.so.1). Every figure is optional: the GB10's unified memory makes
NVML answer "Not Supported" for device memory, other boards lack other sensors,
and a host without a driver has no NVML at all. A figure NVML does not give is
None, and a host without NVML gets a reading that says why (`unavailable`),
never an exception: telemetry must not take the service down.

Calls block (NVML can take tens of milliseconds, more on a sick GPU): the
supervisor calls read() from a worker thread (telemetry.py), never its loop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterable

import pynvml

# NVML's clock event ("throttle") reason bits -> our names. The names are the Prometheus label
# values and the JSON keys, so they stay as they are.
THROTTLE_REASONS: dict[str, int] = {
    "sw_thermal": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "applications_clocks": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "display_clock": pynvml.nvmlClocksEventReasonDisplayClockSetting,
    "idle": pynvml.nvmlClocksEventReasonGpuIdle,
}
THERMAL = frozenset({"sw_thermal", "hw_thermal"})
POWER = frozenset({"sw_power_cap", "hw_power_brake"})


@dataclass(frozen=True)
class GpuDevice:
    """One GPU at one instant. None = NVML does not report that figure on this device."""

    index: int
    name: str | None
    temperature_c: float | None
    sm_clock_mhz: float | None
    memory_clock_mhz: float | None
    max_sm_clock_mhz: float | None
    power_watts: float | None
    power_limit_watts: float | None
    utilization_percent: float | None
    # Clock event reasons active now; None when NVML cannot say.
    throttle: frozenset[str] | None
    memory_used_bytes: int | None      # "Not Supported" on the GB10's unified memory
    memory_total_bytes: int | None
    # What the given processes (the engine's tree) hold on this device, where NVML says.
    engine_memory_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "temperature_c": self.temperature_c,
                "sm_clock_mhz": self.sm_clock_mhz, "memory_clock_mhz": self.memory_clock_mhz,
                "max_sm_clock_mhz": self.max_sm_clock_mhz, "power_watts": self.power_watts,
                "power_limit_watts": self.power_limit_watts, "utilization_percent": self.utilization_percent,
                "throttle": sorted(self.throttle) if self.throttle is not None else None,
                "memory_used_bytes": self.memory_used_bytes, "memory_total_bytes": self.memory_total_bytes,
                "engine_memory_bytes": self.engine_memory_bytes}


@dataclass(frozen=True)
class GpuReading:
    devices: tuple[GpuDevice, ...] = ()
    unavailable: str | None = None  # why there are no devices ("no NVML: ..."), else None
    driver_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.unavailable is not None:
            return {"available": False, "reason": self.unavailable}
        return {"available": True, "driver_version": self.driver_version,
                "devices": [d.to_json() for d in self.devices]}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _why(e: pynvml.NVMLError) -> str:
    try:
        return str(e)
    except Exception:  # pynvml's __str__ calls into the library, which may be what is missing
        return f"NVML error {getattr(e, 'value', '?')}"


@dataclass
class NvmlReader:
    """Opens NVML on first use, keeps it open, and reads every device on each call.

    Not opened again after a failure to open (a host without a driver stays without one); one
    device's failing figure is None, not a failed reading. Thread-safe: one read at a time."""

    _opened: bool = False
    _unavailable: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _open(self) -> str | None:
        if self._opened or self._unavailable is not None:
            return self._unavailable
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            self._unavailable = f"no NVML: {_why(e)}"
            return self._unavailable
        self._opened = True
        return None

    def read(self, engine_pids: Iterable[int] = ()) -> GpuReading:
        with self._lock:
            why = self._open()
            if why is not None:
                return GpuReading(unavailable=why)
            try:
                count = pynvml.nvmlDeviceGetCount()
                driver = _text(pynvml.nvmlSystemGetDriverVersion())
            except pynvml.NVMLError as e:
                return GpuReading(unavailable=f"NVML answers no devices: {_why(e)}")
            pids = set(engine_pids)
            devices = []
            for i in range(count):
                try:
                    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                except pynvml.NVMLError:
                    continue  # a lost GPU: the others still count
                devices.append(read_device(i, handle, pids))
            return GpuReading(tuple(devices), driver_version=driver)

    def close(self) -> None:
        with self._lock:
            if self._opened:
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError:
                    pass
                self._opened = False


def _maybe(fn: Any, *args: Any) -> Any:
    """fn(*args), or None when NVML cannot give it (Not Supported, No Permission, GPU lost, ...)."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def _milli(value: int | None) -> float | None:
    return None if value is None else value / 1000.0


def read_device(index: int, handle: Any, engine_pids: set[int]) -> GpuDevice:
    name = _maybe(pynvml.nvmlDeviceGetName, handle)
    util = _maybe(pynvml.nvmlDeviceGetUtilizationRates, handle)
    reasons = _maybe(pynvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
    mem = _maybe(pynvml.nvmlDeviceGetMemoryInfo, handle)
    limit = _maybe(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    if limit is None:
        limit = _maybe(pynvml.nvmlDeviceGetPowerManagementLimit, handle)
    return GpuDevice(
        index=index,
        name=_text(name) if name is not None else None,
        temperature_c=_maybe(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
        sm_clock_mhz=_maybe(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
        memory_clock_mhz=_maybe(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
        max_sm_clock_mhz=_maybe(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM),
        power_watts=_milli(_maybe(pynvml.nvmlDeviceGetPowerUsage, handle)),
        power_limit_watts=_milli(limit),
        utilization_percent=float(util.gpu) if util is not None else None,
        throttle=None if reasons is None else frozenset(
            n for n, bit in THROTTLE_REASONS.items() if reasons & bit),
        memory_used_bytes=int(mem.used) if mem is not None else None,
        memory_total_bytes=int(mem.total) if mem is not None else None,
        engine_memory_bytes=_engine_memory(handle, engine_pids),
    )


def _engine_memory(handle: Any, pids: set[int]) -> int | None:
    if not pids:
        return None
    procs = _maybe(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
    if procs is None:
        return None
    used = [p.usedGpuMemory for p in procs if p.pid in pids]
    # NVML gives None (NVML_VALUE_NOT_AVAILABLE) per process where it cannot count, as on unified memory.
    if not used or any(u is None for u in used):
        return None
    return int(sum(used))


def gpu_line(g: GpuReading) -> str:
    """One line: each GPU's figures, or why there are none (the journal, the status page)."""
    if g.unavailable is not None:
        return f"gpu: {g.unavailable}"
    if not g.devices:
        return "gpu: NVML answers, no devices"
    out = []
    for d in g.devices:
        bits = []
        if d.temperature_c is not None:
            bits.append(f"{d.temperature_c:g} C")
        if d.sm_clock_mhz is not None:
            bits.append(f"SM {d.sm_clock_mhz:g} MHz")
        if d.power_watts is not None:
            bits.append(f"{d.power_watts:.0f}" + (f"/{d.power_limit_watts:.0f} W" if d.power_limit_watts else " W"))
        if d.utilization_percent is not None:
            bits.append(f"util {d.utilization_percent:g}%")
        slow = sorted((d.throttle or frozenset()) - {"idle"})
        if slow:
            bits.append("throttle " + ",".join(slow))
        out.append(f"gpu{d.index}: " + (", ".join(bits) or "no figures"))
    return "; ".join(out)
