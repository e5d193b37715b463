"""The service's NVML reader (gptoss_spark/service/gpu.py) against a real GPU's NVML, under load.

Device runs only: where NVML has no device (CI, the CPU box) every test skips and says why. The
unit tests (tests/unit/test_gpu_telemetry.py) replace pynvml's device calls; here nothing is
replaced: NvmlReader reads the driver while this process runs a short bf16 matmul, and the engine
memory lookup is given this process's own pid, as the supervisor gives it the engine's tree.
Only what must hold on any GPU is asserted; the readings are written to
.test-artifacts/nvml-gpu.json for the record.
"""

from __future__ import annotations

import json
import os
import threading
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from gptoss_spark.service.gpu import GpuReading, NvmlReader

pytestmark = pytest.mark.gpu

ARTIFACT = Path(__file__).resolve().parents[2] / ".test-artifacts" / "nvml-gpu.json"
MATRIX = 8192  # one bf16 8192x8192 matrix: 128 MiB, ~1 TFLOP per product


@pytest.fixture(scope="module")
def reader():
    r = NvmlReader()
    first = r.read()
    if first.unavailable is not None:
        pytest.skip(f"NVML has no device here: {first.unavailable}")
    if not first.devices:
        pytest.skip("NVML answers but lists no device")
    yield r
    r.close()


@pytest.fixture(scope="module")
def cuda():
    torch = pytest.importorskip("torch", reason="the load needs torch")  # imported only where a GPU is
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device: no load to read under")
    return torch


@pytest.fixture(scope="module")
def under_load(reader, cuda):
    """Readings taken every 0.5 s while a matmul keeps the GPU busy for ~5 s, with this process's pid
    as the engine's; the matrix stays allocated until the last reading."""
    torch = cuda
    a = torch.randn(MATRIX, MATRIX, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    stop = threading.Event()

    def busy():
        x = a
        while not stop.is_set():
            for _ in range(10):
                x = (x @ a).clamp_(-1, 1)
            torch.cuda.synchronize()

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    readings: list[GpuReading] = []
    try:
        time.sleep(1.0)  # clocks and power ramp up; the reads below are what the assertions look at
        for _ in range(10):
            readings.append(reader.read([os.getpid()]))
            time.sleep(0.5)
    finally:
        stop.set()
        worker.join(timeout=60)
    allocated = torch.cuda.memory_allocated()
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps({"nvidia_ml_py": version("nvidia-ml-py"), "torch": torch.__version__,
                                    "allocated_bytes": allocated,
                                    "readings": [r.to_json() for r in readings]}, indent=2) + "\n")
    del a
    return readings, allocated


def test_every_device_reports_sane_figures_under_load(under_load):
    readings, _ = under_load
    for r in readings:
        assert r.unavailable is None and r.driver_version
        for d in r.devices:
            # Present on every GPU NVML serves (memory may be "Not Supported": unified memory, the GB10).
            assert d.name, d
            assert d.temperature_c is not None and 0 < d.temperature_c < 120, d
            assert d.sm_clock_mhz is not None and d.sm_clock_mhz > 0, d
            assert d.max_sm_clock_mhz is not None and 0 < d.sm_clock_mhz <= d.max_sm_clock_mhz, d
            assert d.power_watts is not None and d.power_watts > 0, d
            if d.power_limit_watts is not None:
                # NVML's draw is an average over its own window and the limiter acts on another: a
                # sample may sit a little over the limit, never far over it.
                assert d.power_watts < 1.1 * d.power_limit_watts, d
            assert d.utilization_percent is not None and 0 <= d.utilization_percent <= 100, d
            assert d.throttle is not None, d
            if d.memory_total_bytes is not None:
                assert 0 < d.memory_used_bytes <= d.memory_total_bytes, d


def test_the_loaded_gpu_is_busy_and_not_idle(under_load):
    readings, _ = under_load
    # The busiest device is the one this process computes on (NVML and CUDA may number devices
    # differently, so it is not looked up by index): across ten reads under a continuous matmul it
    # must have been busy, and not clocked down as idle.
    busiest = max((d.utilization_percent or 0, d.index) for r in readings for d in r.devices)
    assert busiest[0] > 0
    assert any(d.throttle is not None and "idle" not in d.throttle
               for r in readings for d in r.devices if d.index == busiest[1])


def _pid_namespaced() -> bool:
    """True in a nested PID namespace (a container), where NVML reports the host's pids, not ours."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) > 2
    return False


def test_engine_memory_finds_this_process_device_memory_by_its_pid(under_load):
    """gpu._engine_memory: the compute processes NVML lists, summed for the given pids."""
    import pynvml

    readings, allocated = under_load
    last = readings[-1]
    pid = os.getpid()
    listed = {}
    for d in last.devices:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(d.index))
        listed[d.index] = [p for p in procs if p.pid == pid]
    if not any(listed.values()):
        if _pid_namespaced():
            pytest.skip("this test runs in a PID namespace: NVML lists the host's pids, not this one "
                        f"({pid}); the service runs in the host's namespace")
        pytest.fail(f"NVML lists no compute process with this test's pid {pid}: {listed}")
    for d in last.devices:
        mine = listed[d.index]
        if not mine:
            assert d.engine_memory_bytes is None, d  # not ours: nothing counted for the engine here
        elif any(p.usedGpuMemory is None for p in mine):
            assert d.engine_memory_bytes is None, d  # unified memory: NVML cannot count it, and says so
        else:
            # What NVML counts for the process: the allocation plus CUDA's context and allocator cache.
            assert d.engine_memory_bytes == sum(p.usedGpuMemory for p in mine), d
            assert d.engine_memory_bytes >= allocated >= MATRIX * MATRIX * 2, d
