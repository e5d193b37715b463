"""GPU telemetry: the NVML reader (service/gpu.py) against nvidia-ml-py's real API, memory figures
(service/hostmem.py), and the sampler's record step (service/telemetry.py) into status and /metrics.

This box has no GPU and no libnvidia-ml.so.1: the first test uses pynvml unchanged and checks the
reader says why. The others replace only the pynvml calls that need a GPU (nvmlInit and the
nvmlDevice* getters) with a GB10-like device; pynvml's own constants, bit masks, error classes
and structures stay real, so a renamed or removed call in a new nvidia-ml-py fails here.
"""

from __future__ import annotations

import types
from pathlib import Path

import pynvml
import pytest

from gptoss_spark.admin.metrics import telemetry_metrics
from gptoss_spark.service import gpu as gpu_mod
from gptoss_spark.service.gpu import GpuReading, NvmlReader
from gptoss_spark.service.hostmem import HostMemory, cgroup_memory_current, host_memory, own_cgroup, tree_rss_bytes
from gptoss_spark.service.memory import MemoryReading
from gptoss_spark.service.probes import GENERATED, RUNNING
from gptoss_spark.service.telemetry import SampleContext, TelemetrySampler
from gptoss_spark.service.throttle import ThrottleWatch


def test_without_a_driver_the_real_pynvml_reading_says_no_nvml_and_why():
    try:  # the premise: this host has no NVML (a GPU host runs benchmarks/gpu_telemetry/read_nvml.py instead)
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this host has NVML; the no-NVML path is tested on hosts without a driver")
    except pynvml.NVMLError_LibraryNotFound:
        pass
    reader = NvmlReader()
    first = reader.read([1])
    assert first.devices == ()
    assert first.unavailable == "no NVML: NVML Shared Library Not Found"
    assert first.to_json() == {"available": False, "reason": "no NVML: NVML Shared Library Not Found"}
    assert reader.read().unavailable == first.unavailable  # stays so, without raising


def not_supported(*_a):
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


@pytest.fixture
def gb10(monkeypatch):
    """One device that answers as a GB10 would: memory 'Not Supported', per-process usage unknown."""
    calls = []
    dev = types.SimpleNamespace(
        temp=71, sm=2418, mem_clock=4266, max_sm=3003, power_mw=95_500, limit_mw=140_000,
        reasons=pynvml.nvmlClocksEventReasonSwThermalSlowdown | pynvml.nvmlClocksEventReasonSwPowerCap,
        procs=[])

    def handle(i):
        calls.append(("handle", i))
        return f"handle{i}"

    def clock(h, kind):
        return {pynvml.NVML_CLOCK_SM: dev.sm, pynvml.NVML_CLOCK_MEM: dev.mem_clock}[kind]

    def temperature(h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return dev.temp

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: calls.append("init"))
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "580.95.05")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", handle)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: "NVIDIA GB10")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", temperature)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetClockInfo", clock)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMaxClockInfo", lambda h, k: dev.max_sm)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", lambda h: dev.power_mw)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetEnforcedPowerLimit", lambda h: dev.limit_mw)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerManagementLimit", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates",
                        lambda h: types.SimpleNamespace(gpu=87, memory=0))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", lambda h: dev.reasons)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", not_supported)  # unified memory
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", lambda h: dev.procs)
    dev.calls = calls
    return dev


def proc(pid, used):
    """What nvmlDeviceGetComputeRunningProcesses returns: pynvml's friendly object of the C struct,
    usedGpuMemory None where NVML says NVML_VALUE_NOT_AVAILABLE."""
    c = pynvml.c_nvmlProcessInfo_v3_t()
    c.pid = pid
    c.usedGpuMemory = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if used is None else used
    obj = pynvml.nvmlStructToFriendlyObject(c)
    if obj.usedGpuMemory == pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
        obj.usedGpuMemory = None
    return obj


def test_reader_maps_every_nvml_figure_and_leaves_unsupported_ones_none(gb10):
    gb10.procs = [proc(42, None), proc(7, 1 << 30)]  # NVML's "not available" per process, as on a GB10
    reading = NvmlReader().read([42])
    assert reading.unavailable is None and reading.driver_version == "580.95.05"
    (d,) = reading.devices
    assert (d.name, d.temperature_c, d.sm_clock_mhz, d.memory_clock_mhz, d.max_sm_clock_mhz) == \
        ("NVIDIA GB10", 71, 2418, 4266, 3003)
    assert (d.power_watts, d.power_limit_watts, d.utilization_percent) == (95.5, 140.0, 87.0)
    assert d.throttle == {"sw_thermal", "sw_power_cap"}
    assert d.memory_used_bytes is None and d.memory_total_bytes is None
    assert d.engine_memory_bytes is None  # the engine's own process: NVML cannot count it here


def test_engine_memory_counts_only_the_engine_tree_where_nvml_counts(gb10):
    gb10.procs = [proc(42, 3 << 30), proc(43, 1 << 30), proc(99, 5 << 30)]
    (d,) = NvmlReader().read([42, 43]).devices
    assert d.engine_memory_bytes == 4 << 30
    (d,) = NvmlReader().read([]).devices
    assert d.engine_memory_bytes is None


def test_a_failing_figure_is_none_and_nvml_is_opened_once(gb10, monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetEnforcedPowerLimit", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerManagementLimit", lambda h: 120_000)
    reader = NvmlReader()
    for _ in range(3):
        (d,) = reader.read().devices
    assert d.temperature_c is None and d.power_limit_watts == 120.0
    assert gb10.calls.count("init") == 1
    reader.close()
    assert gb10.calls[-1] == "shutdown"


def test_a_driver_that_fails_to_initialise_is_reported_not_raised(monkeypatch):
    def fail():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    r = NvmlReader().read()
    assert r.unavailable == "no NVML: Driver Not Loaded"


def test_throttle_names_cover_the_reasons_nvml_defines():
    assert set(gpu_mod.THROTTLE_REASONS.values()) | {pynvml.nvmlClocksEventReasonNone} >= {
        v for k, v in vars(pynvml).items() if k.startswith("nvmlClocksEventReason") and k not in (
            "nvmlClocksEventReasonAll", "nvmlClocksEventReasonUserDefinedClocks")}


# ---- memory figures ----------------------------------------------------------------------------

def test_cgroup_and_tree_rss_are_read_from_proc_and_sysfs(tmp_path: Path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/system.slice/gptoss-spark.service\n")
    for pid, kib in ((10, 1000), (11, 24)):
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "status").write_text(f"Name:\tpython\nVmRSS:\t {kib} kB\nThreads:\t3\n")
    cg = tmp_path / "cg" / "system.slice" / "gptoss-spark.service"
    cg.mkdir(parents=True)
    (cg / "memory.current").write_text("123456789\n")
    path = own_cgroup(proc)
    assert path == "/system.slice/gptoss-spark.service"
    assert cgroup_memory_current(path, tmp_path / "cg") == 123456789
    assert tree_rss_bytes([10, 11, 12], proc) == 1024 * 1024  # 12 ended since it was listed
    assert tree_rss_bytes([12], proc) is None
    m = host_memory(MemoryReading(5 << 30, 8 << 30, 0.5), [10], path, tmp_path / "cg", proc)
    assert m == HostMemory(5 << 30, 8 << 30, 0.5, 123456789, path, 1000 * 1024)
    assert cgroup_memory_current(None) is None and cgroup_memory_current("/nope", tmp_path) is None


def test_this_process_memory_is_readable_on_this_host():
    """The real /proc and cgroup files of this box, as the service reads them (no fakes)."""
    import os

    assert tree_rss_bytes([os.getpid()]) > 10 << 20
    cg = own_cgroup()
    if cg is not None and Path("/sys/fs/cgroup/cgroup.controllers").exists():
        assert cgroup_memory_current(cg) > 0


# ---- the sampler's record step and what it publishes ---------------------------------------------

class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def metrics_of(snapshot) -> dict[str, float]:
    out = {}
    for fam in telemetry_metrics(snapshot):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_record_keeps_tokens_per_second_history_and_publishes_figures(gb10, tmp_path):
    wall = Clock()
    sampler = TelemetrySampler(5.0, memory_source=None, watch=ThrottleWatch(60, 0.5, clock=wall), wall=wall)
    ctx = SampleContext("ready", "demo", 42, "http://127.0.0.1:1")
    gpu = NvmlReader().read([42])
    mem = HostMemory(5 << 30, 8 << 30, 0.5, 3 << 30, "/x", 2 << 30)
    sampler.record(ctx, gpu, mem, {RUNNING: 2.0, GENERATED: 100.0})
    wall.t += 5
    sampler.record(ctx, gpu, mem, {RUNNING: 1.0, GENERATED: 600.0})
    wall.t += 5
    sampler.record(ctx, gpu, mem, None)  # the engine stopped: no point, and the counter starts over
    wall.t += 5
    sampler.record(ctx, gpu, mem, {RUNNING: 0.0, GENERATED: 7.0})
    snap = sampler.latest
    assert [(p.tokens_per_second, p.running) for p in snap.history] == [(None, 2.0), (100.0, 1.0), (None, 0.0)]
    js = snap.to_json()
    assert js["memory"]["cgroup_bytes"] == 3 << 30 and js["memory"]["engine_rss_bytes"] == 2 << 30
    assert js["gpu"]["devices"][0]["throttle"] == ["sw_power_cap", "sw_thermal"]
    m = metrics_of(snap)
    assert m['gptoss_spark_gpu_temperature_celsius{gpu="0"}'] == 71
    assert m['gptoss_spark_gpu_sm_clock_hertz{gpu="0"}'] == 2418e6
    assert m['gptoss_spark_gpu_power_watts{gpu="0"}'] == 95.5
    assert m['gptoss_spark_gpu_utilization_ratio{gpu="0"}'] == pytest.approx(0.87)
    assert m['gptoss_spark_gpu_throttle{gpu="0",reason="sw_thermal"}'] == 1
    assert m['gptoss_spark_gpu_throttle{gpu="0",reason="hw_thermal"}'] == 0
    assert 'gptoss_spark_gpu_memory_used_bytes{gpu="0"}' not in m  # Not Supported: absent, not 0
    assert m["gptoss_spark_cgroup_memory_bytes"] == 3 << 30
    assert m["gptoss_spark_engine_resident_memory_bytes"] == 2 << 30
    assert m["gptoss_spark_gpu_telemetry_available"] == 1


def test_history_is_bounded_to_an_hour():
    wall = Clock()
    sampler = TelemetrySampler(5.0, memory_source=None, watch=ThrottleWatch(60, 0.5, clock=wall), wall=wall)
    ctx = SampleContext("ready", "demo", 42, "http://127.0.0.1:1")
    for i in range(2000):
        wall.t += 5
        sampler.record(ctx, GpuReading(unavailable="no NVML: x"), HostMemory(*[None] * 6), {RUNNING: 0, GENERATED: i})
    h = sampler.latest.history
    assert len(h) == 721 and h[-1].at - h[0].at == 3600
    m = metrics_of(sampler.latest)
    assert m["gptoss_spark_gpu_telemetry_available"] == 0
    assert not any(k.startswith("gptoss_spark_gpu_temperature") for k in m)


def test_grafana_dashboard_queries_only_metric_names_that_exist(gb10, tmp_path):
    """docs/grafana-dashboard.json: each gptoss_spark_* name it queries is one /metrics renders (with a
    GPU sample), each vllm:* name one the supervisor's own probe reads from the engine."""
    import json
    import re

    from gptoss_spark.admin.metrics import make_registry, render
    from gptoss_spark.service.probes import WAITING
    from gptoss_spark.service.supervisor import Supervisor
    from tests.helpers.supervisor_settings import FakeMemory, make_settings

    sup = Supervisor(make_settings(tmp_path, {"demo": ""}), memory_source=FakeMemory(available_gib=50.0, psi=1.5))
    sup.guard.read()
    sup.telemetry.record(SampleContext("ready", "demo", 42, "x"), NvmlReader().read([42]),
                         HostMemory(5 << 30, 8 << 30, 0.5, 3 << 30, "/x", 2 << 30), {RUNNING: 1.0, GENERATED: 5.0})
    # An engine start that got ready, so the start phases and the compile count are rendered too.
    import dataclasses

    from gptoss_spark.service.status import StartStatus

    started = StartStatus(None, {"compiled": ["inductor graph"]}, {"total": ((10.0, 60.0), (0, 1), 42.0, 1),
                                                                    "compile": ((10.0, 60.0), (1, 1), 7.0, 1)})
    status = lambda: dataclasses.replace(sup.status(), start=started)  # noqa: E731
    rendered = {line.split("{")[0].split(" ")[0] for line in render(make_registry(status)).decode().splitlines()
                if line and not line.startswith("#")}
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    ours = {n for e in exprs for n in re.findall(r"gptoss_spark_[a-z0-9_]+", e)}
    vllm = {n for e in exprs for n in re.findall(r"vllm:[a-z0-9_]+", e)}
    assert len(ours) >= 15 and ours <= rendered, ours - rendered
    assert vllm == {GENERATED, RUNNING, WAITING}
    # The start phases, the compile count, GPU availability; one service (gptoss-spark@NAME) at a time.
    assert {"gptoss_spark_engine_start_phase_seconds_sum", "gptoss_spark_engine_start_compiles",
            "gptoss_spark_gpu_telemetry_available"} <= ours
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["service"]
    assert all('service=~"$service"' in e for e in exprs for _ in re.findall(r"(?:gptoss_spark_|vllm:)[a-z0-9_]+", e))


# ---- the journal at state changes ----------------------------------------------------------------

def test_every_state_change_journals_the_latest_figures_once_there_are_some(gb10, tmp_path):
    """Through the supervisor's own transition hook: no line before the first sample, then one
    `telemetry` line per state change carrying the snapshot's one-line summary."""
    from structlog.testing import capture_logs

    from gptoss_spark.service.states import State
    from gptoss_spark.service.supervisor import Supervisor
    from tests.helpers.supervisor_settings import FakeMemory, make_settings

    sup = Supervisor(make_settings(tmp_path, {"demo": ""}), memory_source=FakeMemory(available_gib=50.0))
    with capture_logs() as before:
        sup.sm.to(State.STARTING, "test", "demo")
    assert [e for e in before if e["event"] == "telemetry"] == []  # nothing sampled yet: nothing to say
    sup.telemetry.record(SampleContext("starting", "demo", 42, None), NvmlReader().read([42]),
                         HostMemory(5 << 30, 8 << 30, 0.5, 3 << 30, "/x", 2 << 30), None)
    with capture_logs() as lines:
        sup.sm.to(State.LOADING, "spawned", "demo")
        sup.sm.to(State.READY, "healthy", "demo")
    journal = [e for e in lines if e["event"] == "telemetry"]
    assert [e["state"] for e in journal] == ["loading", "ready"]
    assert journal[0]["figures"] == sup.telemetry.latest.summary()
    assert journal[0]["figures"].startswith(
        "gpu0: 71 C, SM 2418 MHz, 96/140 W, util 87%, throttle sw_power_cap,sw_thermal | memory: 5.0 GiB available")


# ---- a hung NVML -----------------------------------------------------------------------------------

def test_a_hung_nvml_read_blocks_neither_the_loop_nor_starts_a_second_sample():
    """A reader stuck in NVML (as a sick GPU's driver can be): the loop's other tasks keep running,
    the sampler waits for that one read instead of piling up threads, and samples resume once it
    returns. Progress is counted in loop turns and reads, not timed."""
    import asyncio
    import threading

    from tests.helpers.supervisor_settings import FakeMemory

    entered, release = threading.Event(), threading.Event()
    reads = []

    class HungReader:
        def read(self, engine_pids=()):
            reads.append(threading.current_thread().name)
            entered.set()
            release.wait(30)  # a bound only so that a read made on the loop's thread fails, not hangs
            return GpuReading(unavailable="no NVML: test")

    wall = Clock()
    sampler = TelemetrySampler(0.01, memory_source=FakeMemory(), watch=ThrottleWatch(60, 0.5, clock=wall),
                               reader=HungReader())
    context = lambda: SampleContext("ready", "demo", None, None)  # noqa: E731

    async def main():
        task = asyncio.create_task(sampler.run(context))
        while not entered.is_set():
            await asyncio.sleep(0.001)
        beats = 0

        async def heartbeat():  # another of the supervisor's tasks: probes, watchdog pings, the admin API
            nonlocal beats
            for _ in range(100):
                await asyncio.sleep(0.01)  # 100 sampling intervals while the read hangs
                beats += 1

        await heartbeat()
        stuck = (beats, list(reads), sampler.latest)
        release.set()
        while len(reads) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return stuck

    beats, reads_while_stuck, latest_while_stuck = asyncio.run(asyncio.wait_for(main(), 60))
    assert beats == 100
    assert reads_while_stuck == ["telemetry-sample"]  # one read in flight, off the loop's thread
    assert latest_while_stuck is None
    assert sampler.latest is not None and sampler.latest.gpu.unavailable == "no NVML: test"


def test_cancelling_the_sampler_during_a_hung_read_returns_at_once():
    """The supervisor's exit: a read that never returns must not hold it (the thread is a daemon)."""
    import asyncio
    import threading

    from tests.helpers.supervisor_settings import FakeMemory

    entered, never = threading.Event(), threading.Event()

    class HungReader:
        def read(self, engine_pids=()):
            entered.set()
            never.wait(30)

    sampler = TelemetrySampler(1.0, memory_source=FakeMemory(), watch=ThrottleWatch(60, 0.5), reader=HungReader())

    async def main():
        task = asyncio.create_task(sampler.run(lambda: SampleContext("stopping", None, None, None)))
        while not entered.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"

    try:
        assert asyncio.run(asyncio.wait_for(main(), 60)) == "cancelled"
    finally:
        never.set()
