"""The supervisor's telemetry sampler: GPU, memory and the engine's throughput, off its event loop.

Every gpu.sample_interval seconds one worker thread reads NVML (gpu.py), the host's memory
figures (hostmem.py) and the engine's own /metrics, and hands back one immutable
TelemetrySnapshot; the loop only stores it, feeds the throttle watch (throttle.py) and sends an
alert when an episode of a kind in gpu.alerts starts. One sample is in flight at a time, so a slow NVML slows sampling,
never the supervisor (its health probes, watchdog pings and admin API stay on the loop).

The last hour of tokens/s and running requests is kept in memory in a bounded ring for the status
page (admin/page.py); nothing is written to disk.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import structlog

from .alerts import Alerter
from .engine import session_members
from .gpu import GpuReading, NvmlReader, gpu_line
from .hostmem import HostMemory, host_memory, own_cgroup
from .memory import MemorySource
from .probes import GENERATED, RUNNING, parse_prometheus_sums
from .throttle import EpisodeChange, ThrottleWatch

log = structlog.get_logger("gptoss_spark.service.telemetry")

HISTORY_SECONDS = 3600.0


@dataclass(frozen=True)
class EnginePoint:
    at: float                        # unix time
    tokens_per_second: float | None  # generated tokens/s since the previous point; None at the first
    running: float                   # requests running


@dataclass(frozen=True)
class TelemetrySnapshot:
    at: float                          # unix time of the sample
    gpu: GpuReading
    memory: HostMemory
    history: tuple[EnginePoint, ...]   # the last hour, oldest first
    episodes: tuple[tuple[str, int], ...]  # (kind, gpu) throttle episodes going on
    episodes_total: tuple[tuple[str, int], ...]  # (kind, count) episodes started since the supervisor started
    alert_kinds: frozenset[str] = frozenset()  # gpu.alerts: the kinds whose episodes send an alert
    # Whether this sample read an engine's counters: when not (stopped for a switch, crashed, loading),
    # the history's last point is a figure of an engine that is gone, not a current one.
    engine_live: bool = False

    def to_json(self) -> dict[str, Any]:
        """/admin/status's `telemetry` (the history stays out: the status page renders it)."""
        last = self.history[-1] if self.history and self.engine_live else None
        return {"sampled_at": self.at, "gpu": self.gpu.to_json(), "memory": self.memory.to_json(),
                "throttle_episodes": [{"kind": k, "gpu": g} for k, g in self.episodes],
                "engine": None if last is None else {"tokens_per_second": last.tokens_per_second,
                                                     "running": last.running, "at": last.at}}

    def summary(self) -> str:
        """One line for the journal and `gptoss-spark status`."""
        return " | ".join((gpu_line(self.gpu), memory_line(self.memory)))


def _gib(b: int | None) -> str:
    return "?" if b is None else f"{b / 2**30:.1f} GiB"


def memory_line(m: HostMemory) -> str:
    parts = [f"memory: {_gib(m.available_bytes)} available"]
    if m.cgroup_bytes is not None:
        parts.append(f"unit {_gib(m.cgroup_bytes)}")
    if m.engine_rss_bytes is not None:
        parts.append(f"engine RSS {_gib(m.engine_rss_bytes)}")
    if m.psi_some_avg10 is not None:
        parts.append(f"PSI {m.psi_some_avg10:g}%")
    return ", ".join(parts)


@dataclass(frozen=True)
class SampleContext:
    """What the supervisor tells the sampler each time: what runs now."""

    state: str
    profile: str | None
    engine_pid: int | None   # the engine's session leader (its tree is that session)
    engine_url: str | None


def _in_thread(fn: Callable[[], Any]) -> "asyncio.Future[Any]":
    """Run fn in a daemon thread: a hung NVML call can neither block the loop nor the process's exit."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def work() -> None:
        try:
            outcome = (True, fn())
        except BaseException as e:  # handed to the loop, which logs it
            outcome = (False, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed meanwhile (the supervisor exited): nobody waits for it
            pass

    threading.Thread(target=work, name="telemetry-sample", daemon=True).start()
    return fut


class TelemetrySampler:
    def __init__(self, interval: float, memory_source: MemorySource, watch: ThrottleWatch,
                 alerter: Alerter | None = None, reader: NvmlReader | None = None,
                 probe_timeout: float = 2.0, wall: Callable[[], float] = time.time):
        self.interval = interval
        self.memory_source = memory_source
        self.watch = watch
        self.alerter = alerter
        self.reader = reader or NvmlReader()
        self.probe_timeout = min(probe_timeout, interval)
        self.wall = wall
        self.cgroup = own_cgroup()
        self._history: deque[EnginePoint] = deque(maxlen=math.ceil(HISTORY_SECONDS / interval) + 1)
        self._last_counter: tuple[float, float] | None = None  # (unix time, generation_tokens_total)
        self._episodes_total: dict[str, int] = {}
        self.latest: TelemetrySnapshot | None = None

    # ---- one sample (worker thread) -----------------------------------------------------------

    def read(self, ctx: SampleContext) -> tuple[GpuReading, HostMemory, dict[str, float] | None]:
        pids = session_members(ctx.engine_pid) if ctx.engine_pid else []
        gpu = self.reader.read(pids)
        try:
            guard = self.memory_source.read()
        except (OSError, KeyError, ValueError):
            guard = None
        memory = host_memory(guard, pids, self.cgroup)
        return gpu, memory, self._engine_counters(ctx.engine_url) if ctx.engine_pid else None

    def _engine_counters(self, url: str | None) -> dict[str, float] | None:
        if not url:
            return None
        try:
            r = httpx.get(f"{url.rstrip('/')}/metrics", timeout=self.probe_timeout)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        return parse_prometheus_sums(r.text, (RUNNING, GENERATED))

    # ---- on the loop --------------------------------------------------------------------------

    def record(self, ctx: SampleContext, gpu: GpuReading, memory: HostMemory,
               counters: dict[str, float] | None) -> list[EpisodeChange]:
        """Store one sample; returns the throttle episodes that started or ended with it."""
        now = self.wall()
        running = 0.0
        if counters is not None:
            running = counters[RUNNING]
            generated = counters[GENERATED]
            rate = None
            if self._last_counter is not None and generated >= self._last_counter[1] and now > self._last_counter[0]:
                rate = (generated - self._last_counter[1]) / (now - self._last_counter[0])
            self._last_counter = (now, generated)
            self._history.append(EnginePoint(now, rate, running))
        else:
            self._last_counter = None  # a new engine's counter starts at 0 again
        changes = self.watch.observe(gpu, generating=running > 0)
        for c in changes:
            if c.started:
                self._episodes_total[c.kind] = self._episodes_total.get(c.kind, 0) + 1
        self.latest = TelemetrySnapshot(now, gpu, memory, tuple(self._history), tuple(self.watch.active()),
                                        tuple(sorted(self._episodes_total.items())), self.watch.alerts,
                                        engine_live=counters is not None)
        for c in changes:
            if c.started and c.alert:
                log.warning("gpu throttle episode", kind=c.kind, gpu=c.device, reason=c.reason)
                if self.alerter is not None:
                    self.alerter.notify(c.event, ctx.state, ctx.profile, c.reason, figures=c.figures)
            elif c.started:  # a kind the owner left out of gpu.alerts: tracked and shown, not sent
                log.info("gpu throttle episode", kind=c.kind, gpu=c.device, reason=c.reason, alert=False)
            else:
                log.info("gpu throttle episode over", kind=c.kind, gpu=c.device, seconds=round(c.seconds, 1))
        return changes

    async def sample(self, ctx: SampleContext) -> TelemetrySnapshot | None:
        gpu, memory, counters = await _in_thread(lambda: self.read(ctx))
        self.record(ctx, gpu, memory, counters)
        return self.latest

    async def run(self, context: Callable[[], SampleContext]) -> None:
        """Sample until cancelled. A failing sample is logged and the next one comes as usual."""
        said_unavailable = False
        while True:
            started = time.monotonic()
            try:
                snap = await self.sample(context())
                if snap is not None and snap.gpu.unavailable and not said_unavailable:
                    log.info("gpu telemetry unavailable", reason=snap.gpu.unavailable)
                    said_unavailable = True
            except asyncio.CancelledError:
                raise
            except Exception as e:  # telemetry must never take the supervisor down
                log.warning("telemetry sample failed", error=f"{type(e).__name__}: {e}")
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def journal(self, state: str) -> None:
        """The figures at a state change, one journal line."""
        if self.latest is not None:
            log.info("telemetry", state=state, figures=self.latest.summary())
