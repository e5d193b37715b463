"""/metrics: the supervisor's own numbers in Prometheus text format.

A custom collector takes one status snapshot (Supervisor.status(),
service/status.py) at scrape time and renders it into a private registry: no
mutable global metrics to keep in step, nothing from other libraries'
default registry, and every number of one scrape from the same instant. The engine's own vLLM metrics stay on the engine
port (engine.port/metrics): scrape both (docs/ADMIN.md).
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                    InfoMetricFamily, Metric)
from prometheus_client.registry import Collector

from .. import __version__
from ..service.alert_kinds import GpuAlertKind
from ..service.states import State
from ..service.status import SupervisorStatus
from ..service.gpu import THROTTLE_REASONS
from ..service.telemetry import TelemetrySnapshot

PREFIX = "gptoss_spark"


def status_metrics(st: SupervisorStatus) -> Iterator[Metric]:
    """The metric families of one snapshot."""
    current = st.state

    state = GaugeMetricFamily(f"{PREFIX}_state", "1 for the supervisor's current state, 0 for the others",
                              labels=["state"])
    for s in State:
        state.add_metric([s.value], 1.0 if s == current else 0.0)
    yield state

    yield GaugeMetricFamily(f"{PREFIX}_ready", "1 when the engine serves (state ready)",
                            value=1.0 if current == State.READY else 0.0)

    info = InfoMetricFamily(f"{PREFIX}_profile", "The profile the engine runs (or is starting with)")
    info.add_metric([], {"profile": st.profile or ""})
    yield info

    seconds = CounterMetricFamily(f"{PREFIX}_state_seconds", "Seconds spent in each state since start",
                                  labels=["state"])
    for s, v in st.state_seconds.items():
        seconds.add_metric([s.value], round(v, 3))
    yield seconds

    yield CounterMetricFamily(f"{PREFIX}_engine_restarts", "Engine restarts after failures (backoff retries)",
                              value=st.counters.restarts)

    switches = CounterMetricFamily(f"{PREFIX}_profile_switches", "Profile switches by outcome",
                                   labels=["outcome"])
    switches.add_metric(["ok"], st.counters.switches_ok)
    switches.add_metric(["failed"], st.counters.switches_failed)
    yield switches

    yield CounterMetricFamily(f"{PREFIX}_memory_guard_trips",
                              "Times the memory guard stopped the engine to protect the host",
                              value=st.guard.trips)

    mem = st.guard.reading
    if mem is not None:
        yield GaugeMetricFamily(f"{PREFIX}_memory_available_bytes", "MemAvailable at the last guard reading",
                                value=mem.available_bytes)
        if mem.psi_some_avg10 is not None:
            yield GaugeMetricFamily(f"{PREFIX}_memory_pressure_some_avg10",
                                    "Memory PSI 'some avg10' (%) at the last guard reading",
                                    value=mem.psi_some_avg10)

    if st.telemetry is not None:
        yield from telemetry_metrics(st.telemetry)

    yield GaugeMetricFamily(f"{PREFIX}_start_time_seconds", "When the supervisor started (unix time)",
                            value=st.started_at)

    if st.start is not None:
        phases = HistogramMetricFamily(f"{PREFIX}_engine_start_phase_seconds",
                                       "Seconds of each phase of the engine starts that got ready "
                                       "(phase total: spawn to ready)", labels=["phase"])
        for phase, (bounds, counts, total, _n) in st.start.histograms.items():
            buckets = [(str(b), c) for b, c in zip(bounds, counts)] + [("+Inf", counts[-1])]
            phases.add_metric([phase], buckets, total)
        yield phases
        last = st.start.last or {}
        yield GaugeMetricFamily(f"{PREFIX}_engine_start_compiles",
                                "What the last engine start compiled (log events and new kernel cache entries)",
                                value=len(last.get("compiled") or []))

    build = InfoMetricFamily(f"{PREFIX}_build", "gptoss-spark version")
    build.add_metric([], {"version": __version__})
    yield build


MHZ = 1e6

# (metric suffix, help, GpuDevice attribute, scale to base units); a figure NVML does not give is left out.
GPU_GAUGES = (
    ("temperature_celsius", "GPU temperature", "temperature_c", 1.0),
    ("sm_clock_hertz", "Current SM clock", "sm_clock_mhz", MHZ),
    ("sm_clock_max_hertz", "Maximum SM clock of the device", "max_sm_clock_mhz", MHZ),
    ("memory_clock_hertz", "Current memory clock", "memory_clock_mhz", MHZ),
    ("power_watts", "Power draw", "power_watts", 1.0),
    ("power_limit_watts", "Enforced power limit", "power_limit_watts", 1.0),
    ("utilization_ratio", "GPU utilization (0-1) over NVML's last sample period", "utilization_percent", 0.01),
    ("memory_used_bytes", "Device memory in use (not reported on unified memory)", "memory_used_bytes", 1.0),
    ("engine_memory_bytes", "Device memory held by the engine's processes, where NVML counts it",
     "engine_memory_bytes", 1.0),
)


def telemetry_metrics(t: TelemetrySnapshot) -> Iterator[Metric]:
    """The sampler's last sample (service/telemetry.py): GPU figures where NVML answers, memory always."""
    yield GaugeMetricFamily(f"{PREFIX}_gpu_telemetry_available",
                            "1 when NVML answers; 0 on a host without it (the reason is in /admin/status)",
                            value=0.0 if t.gpu.unavailable else 1.0)
    yield GaugeMetricFamily(f"{PREFIX}_telemetry_sample_time_seconds", "When the last sample was taken (unix time)",
                            value=t.at)
    devices = t.gpu.devices
    if devices:
        info = InfoMetricFamily(f"{PREFIX}_gpu", "The GPU's name and driver", labels=["gpu"])
        for d in devices:
            info.add_metric([str(d.index)], {"name": d.name or "", "driver_version": t.gpu.driver_version or ""})
        yield info
        for suffix, help_, attr, scale in GPU_GAUGES:
            fam = GaugeMetricFamily(f"{PREFIX}_gpu_{suffix}", help_, labels=["gpu"])
            for d in devices:
                v = getattr(d, attr)
                if v is not None:
                    fam.add_metric([str(d.index)], float(v) * scale)
            if fam.samples:
                yield fam
        throttle = GaugeMetricFamily(f"{PREFIX}_gpu_throttle", "1 while NVML reports this clock event reason",
                                     labels=["gpu", "reason"])
        for d in devices:
            if d.throttle is not None:
                for reason in THROTTLE_REASONS:
                    throttle.add_metric([str(d.index), reason], 1.0 if reason in d.throttle else 0.0)
        if throttle.samples:
            yield throttle
        active = GaugeMetricFamily(f"{PREFIX}_gpu_throttle_episode", "1 during a sustained throttle episode",
                                   labels=["gpu", "kind"])
        going = set(t.episodes)
        for d in devices:
            for kind in GpuAlertKind:
                active.add_metric([str(d.index), kind.value], 1.0 if (kind, d.index) in going else 0.0)
        yield active
    episodes = CounterMetricFamily(f"{PREFIX}_gpu_throttle_episodes",
                                   "Throttle episodes started (each alerted once where its kind is in gpu.alerts)",
                                   labels=["kind"])
    counts = dict(t.episodes_total)
    for kind in GpuAlertKind:
        episodes.add_metric([kind.value], counts.get(kind, 0))
    yield episodes

    m = t.memory
    for name, help_, v in (
            ("memory_total_bytes", "MemTotal of the host", m.total_bytes),
            ("cgroup_memory_bytes", "memory.current of the service's cgroup (engine included; unified memory)",
             m.cgroup_bytes),
            ("engine_resident_memory_bytes", "Resident set of the engine's process tree", m.engine_rss_bytes)):
        if v is not None:
            yield GaugeMetricFamily(f"{PREFIX}_{name}", help_, value=float(v))


class StatusCollector(Collector):
    """Reads a fresh snapshot on each scrape."""

    def __init__(self, status: Callable[[], SupervisorStatus]):
        self.status = status

    def collect(self) -> Iterator[Metric]:
        return status_metrics(self.status())


def make_registry(status: Callable[[], SupervisorStatus]) -> CollectorRegistry:
    """status: where each scrape's snapshot comes from (the supervisor's status method)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(status))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
