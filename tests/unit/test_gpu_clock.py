"""The clock cap (gptoss_spark/gpuclock.py) and how the unit runs it.

Without a GPU: pynvml's real API with only the device calls replaced (a two-GPU host that records
what was locked), the real no-NVML path of this box, and the unit's ExecStartPre=+/ExecStopPost=+
lines parsed by the CLI's own parser. On a GPU: benchmarks/gpu_telemetry/read_nvml.py --cap.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from gptoss_spark import gpuclock
from gptoss_spark.cli import build_parser
from gptoss_spark.base.errors import RequirementError
from gptoss_spark.base.exit_codes import EXIT_OK, EXIT_REQUIREMENT
from tests.unit.test_unit_file import EXEC, directives


@pytest.fixture
def two_gpus(monkeypatch):
    locked: dict[str, tuple[int, int] | None] = {"h0": None, "h1": None}
    fail_on: set[str] = set()

    def lock(h, lo, hi):
        if h in fail_on:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)
        locked[h] = (lo, hi)

    def reset(h):
        locked[h] = None

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: f"h{i}")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMaxClockInfo", lambda h, k: 3003)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedMemoryClocks", lambda h: [4266, 810])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedGraphicsClocks",
                        lambda h, m: [3003, 1980, 345] if m == 4266 else [810, 405])
    monkeypatch.setattr(pynvml, "nvmlDeviceSetGpuLockedClocks", lock)
    monkeypatch.setattr(pynvml, "nvmlDeviceResetGpuLockedClocks", reset)
    return locked, fail_on


def test_apply_locks_every_gpu_from_its_lowest_clock_to_the_cap_and_reset_undoes_it(two_gpus, tmp_path):
    locked, _ = two_gpus
    marker = tmp_path / "run" / "gpu-clock.json"
    msg = gpuclock.apply(2400, marker, pynvml)
    assert locked == {"h0": (345, 2400), "h1": (345, 2400)}
    assert msg == "GPU 0: SM clock locked to 345-2400 MHz; GPU 1: SM clock locked to 345-2400 MHz"
    assert json.loads(marker.read_text()) == {"gpus": [0, 1], "max_mhz": 2400}
    assert gpuclock.reset(marker, pynvml) == "SM clock lock reset on GPU 0, 1"
    assert locked == {"h0": None, "h1": None} and not marker.exists()


def test_no_cap_touches_nothing_but_a_leftover_cap_of_ours_is_reset(two_gpus, tmp_path):
    locked, _ = two_gpus
    marker = tmp_path / "gpu-clock.json"
    assert gpuclock.apply(0, marker, pynvml).startswith("no cap set")
    assert locked == {"h0": None, "h1": None} and not marker.exists()
    locked["h0"] = (100, 1000)  # someone's own `nvidia-smi -lgc`: not ours, so left alone
    assert gpuclock.reset(marker, pynvml) == "no cap of ours is on: nothing to reset"
    assert locked["h0"] == (100, 1000)
    gpuclock.apply(2000, marker, pynvml)  # ours, then the setting is removed and the service restarts
    assert gpuclock.apply(0, marker, pynvml) == "no cap set; SM clock lock reset on GPU 0, 1"
    assert locked == {"h0": None, "h1": None}


def test_a_cap_above_the_maximum_is_refused_with_exit_3_before_anything_is_locked(two_gpus, tmp_path):
    """A valid setting this host's GPU cannot take: a requirement (exit 3, docs/EXIT_CODES.md), as
    docs/OPERATIONS.md "GPU clock cap" says, not a bad settings file (exit 2)."""
    locked, _ = two_gpus
    with pytest.raises(RequirementError, match="gpu.max_clock_mhz = 5000 is above GPU 0's maximum SM clock 3003 MHz"
                       ) as e:
        gpuclock.apply(5000, tmp_path / "m", pynvml)
    assert e.value.exit_code == EXIT_REQUIREMENT
    assert locked == {"h0": None, "h1": None}


def test_the_pstate_call_has_the_signature_the_floor_uses():
    """Real pynvml, before any replacement: a renamed or reshaped call fails here, not on a GB10."""
    import ctypes
    import inspect

    inspect.signature(pynvml.nvmlDeviceGetMinMaxClockOfPState).bind(
        "h", pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_PSTATE_0, ctypes.c_uint(), ctypes.c_uint())
    inspect.signature(pynvml.nvmlDeviceGetSupportedPerformanceStates).bind("h")


def no_supported_clocks(monkeypatch):
    def not_supported(*_a):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedMemoryClocks", not_supported)
    return not_supported


def test_without_a_supported_clocks_list_the_floor_is_the_lowest_pstate_minimum(two_gpus, tmp_path, monkeypatch):
    locked, _ = two_gpus
    not_supported = no_supported_clocks(monkeypatch)
    asked = []

    def minmax(h, clock_type, pstate, lo_ref, hi_ref):
        asked.append((clock_type, pstate))
        if pstate == pynvml.NVML_PSTATE_2:
            not_supported()
        return {pynvml.NVML_PSTATE_0: (1200, 3003), pynvml.NVML_PSTATE_8: (208, 900)}[pstate]

    monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedPerformanceStates",
                        lambda h: [pynvml.NVML_PSTATE_0, pynvml.NVML_PSTATE_2, pynvml.NVML_PSTATE_8])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMinMaxClockOfPState", minmax)
    assert gpuclock.plan(pynvml, 2400) == [gpuclock.Cap(0, 208, 2400, "P-states"),
                                           gpuclock.Cap(1, 208, 2400, "P-states")]
    assert {t for t, _ in asked} == {pynvml.NVML_CLOCK_GRAPHICS}  # the clock the lock sets
    assert gpuclock.apply(2400, tmp_path / "m", pynvml).startswith("GPU 0: SM clock locked to 208-2400 MHz; ")
    assert locked == {"h0": (208, 2400), "h1": (208, 2400)}


@pytest.mark.parametrize("cap,low", [(2400, gpuclock.FALLBACK_FLOOR_MHZ), (400, 400)])
def test_with_no_minimum_from_nvml_the_floor_is_the_documented_one_never_0(two_gpus, tmp_path, monkeypatch, cap, low):
    locked, _ = two_gpus
    not_supported = no_supported_clocks(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedPerformanceStates", not_supported)
    msg = gpuclock.apply(cap, tmp_path / "m", pynvml)
    assert locked == {"h0": (low, cap), "h1": (low, cap)}
    assert msg.startswith(f"GPU 0: SM clock locked to {low}-{cap} MHz (NVML names no lowest clock: floor 500 MHz); ")


def test_an_empty_supported_clocks_list_falls_through_to_the_pstates(two_gpus, monkeypatch):
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedMemoryClocks", lambda h: [])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSupportedPerformanceStates", lambda h: [pynvml.NVML_PSTATE_0])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMinMaxClockOfPState", lambda h, t, p, a, b: (0, 3003))  # 0: no answer
    assert [c.min_mhz for c in gpuclock.plan(pynvml, 2000)] == [gpuclock.FALLBACK_FLOOR_MHZ] * 2


def test_a_cap_that_cannot_be_applied_everywhere_is_undone_and_fails_the_start(two_gpus, tmp_path):
    locked, fail_on = two_gpus
    fail_on.add("h1")
    with pytest.raises(RequirementError, match="could not cap GPU 1's SM clock at 2400 MHz .*needs root"):
        gpuclock.apply(2400, tmp_path / "m", pynvml)
    assert locked == {"h0": None, "h1": None} and not (tmp_path / "m").exists()


def test_on_a_host_without_nvml_a_set_cap_fails_with_exit_3_and_no_cap_is_fine(tmp_path):
    try:
        pynvml.nvmlInit()
        pytest.skip("this host has NVML")
    except pynvml.NVMLError_LibraryNotFound:
        pass
    config = tmp_path / "s.toml"
    run = [sys.executable, "-m", "gptoss_spark.cli", "gpu-clock", "apply", "--config", str(config)]
    config.write_text("[gpu]\nmax_clock_mhz = 0\n")
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (EXIT_OK, "gpu-clock: no cap set (gpu.max_clock_mhz = 0): "
                                                         "clocks left as they are"), r.stderr
    config.write_text("[gpu]\nmax_clock_mhz = 2000\n")
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert r.returncode == EXIT_REQUIREMENT
    assert r.stderr.strip() == ("gptoss-spark: error: gpu.max_clock_mhz is set but NVML is unavailable (NVML Shared "
                                "Library Not Found); install the NVIDIA driver or set gpu.max_clock_mhz = 0")
    config.write_text("[gpu]\nmax_clock = 2000\n")  # a typo: left to serve, which exits 2 for it
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert r.returncode == EXIT_OK and "settings unusable, nothing applied" in r.stdout and "gpu.max_clock" in r.stdout


def test_the_unit_runs_apply_as_root_before_serve_and_reset_after_stop():
    d = directives()
    (pre,) = d["ExecStartPre"]
    (post,) = d["ExecStopPost"]
    # `+`: this one command with full privileges; the service itself keeps none.
    assert pre.startswith("+" + EXEC + " gpu-clock apply ") and post.startswith("+" + EXEC + " gpu-clock reset ")
    assert d["NoNewPrivileges"] == ["true"] and d["CapabilityBoundingSet"] == [""]
    for line in (pre, post):
        args = build_parser().parse_args(shlex.split(line)[1:])
        assert args.func is gpuclock.cmd_gpu_clock and args.config == "/etc/gptoss-spark/gptoss-spark.toml"
    assert Path(gpuclock.MARKER).is_relative_to("/run")  # a reboot (which resets clocks) clears it
