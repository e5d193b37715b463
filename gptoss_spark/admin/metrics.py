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
from ..service.states import State
from ..service.status import SupervisorStatus

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
