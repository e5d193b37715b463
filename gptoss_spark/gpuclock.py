"""`gptoss-spark gpu-clock apply|reset`: the optional SM clock cap (gpu.max_clock_mhz) around the service.

Spark owners cap the GPU clock (`nvidia-smi -lgc`) against thermal shutdowns under sustained
load. Locking clocks needs root, and the service runs as its own user with no capabilities and
NoNewPrivileges, so the supervisor cannot do it itself. The unit runs this command instead, as
root through systemd's `+` prefix (full privileges for that one command, not for the service):

    ExecStartPre=+.../gptoss-spark gpu-clock apply --config ...   before `serve`, so before any engine
    ExecStopPost=+.../gptoss-spark gpu-clock reset --config ...   after the service and its engine are gone

apply: cap unset (0) -> nothing, unless an earlier cap of ours is still on (a crash, the setting
removed since): that one is reset. Cap set -> every GPU's SM clock locked to [lowest clock, cap];
a cap that cannot be applied (no NVML, not permitted, above the GPU's maximum) fails the start with
one line (exit 3, RequirementError: the setting is valid, this host's GPU cannot take it): the owner
asked for it to keep the box from overheating, so it must not run uncapped unnoticed.
The lowest clock is NVML's: the lowest supported graphics clock, else the lowest P-state minimum,
else FALLBACK_FLOOR_MHZ (whether the lock accepts 0 as its lower end is not documented).
reset: only a cap this command applied (a marker under /run says so), so a clock lock
someone set by hand with nvidia-smi is left alone.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base.errors import ConfigError, RequirementError, UserError
from .base.exit_codes import EXIT_OK
from .base.fsutil import read_json
from .base.defaults import CONFIG_HELP

# Root-only (the command runs as root); /run is a tmpfs, so a reboot, which resets the clocks too,
# clears it.
MARKER = Path("/run/gptoss-spark/gpu-clock.json")


# The lock's lower end where NVML names no lowest clock (the GB10 may answer "Not Supported" for
# its supported-clocks list). nvmlDeviceSetGpuLockedClocks documents no 0 = "as low as you can",
# so a clock inside the device's range instead: GB10s have been reported running at 500 MHz (the
# low-power state, docs/OPERATIONS.md), and it is above the lowest clock of recent NVIDIA GPUs (an
# idle H200 read 345 MHz). The cost: an idle GPU stays at or above it, a few watts.
FALLBACK_FLOOR_MHZ = 500


@dataclass(frozen=True)
class Cap:
    index: int
    min_mhz: int
    max_mhz: int
    floor_from: str = "supported clocks"  # where min_mhz came from: supported clocks, P-states, fallback


def _nvml() -> Any:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise RequirementError(f"gpu.max_clock_mhz is set but NVML is unavailable ({e}); "
                               "install the NVIDIA driver or set gpu.max_clock_mhz = 0") from None
    return pynvml


def lowest_clock(nvml: Any, handle: Any) -> tuple[int, str]:
    """The GPU's lowest graphics clock in MHz as NVML names it, and where from."""
    try:
        lows = [c for m in nvml.nvmlDeviceGetSupportedMemoryClocks(handle)
                for c in nvml.nvmlDeviceGetSupportedGraphicsClocks(handle, m) if c > 0]
        if lows:
            return min(lows), "supported clocks"
    except nvml.NVMLError:
        pass
    try:
        pstates = nvml.nvmlDeviceGetSupportedPerformanceStates(handle)
    except nvml.NVMLError:
        pstates = []
    lows = []
    for ps in pstates:
        try:
            # Fresh out-parameters: pynvml's defaults are shared objects.
            lo, _ = nvml.nvmlDeviceGetMinMaxClockOfPState(handle, nvml.NVML_CLOCK_GRAPHICS, ps,
                                                          ctypes.c_uint(), ctypes.c_uint())
        except nvml.NVMLError:
            continue
        if lo > 0:
            lows.append(lo)
    if lows:
        return min(lows), "P-states"
    return FALLBACK_FLOOR_MHZ, "fallback"


def plan(nvml: Any, cap_mhz: int) -> list[Cap]:
    """The lock range for each GPU: from its lowest clock (lowest_clock) up to the cap."""
    caps = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        top = nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM)
        if cap_mhz > top:
            raise RequirementError(f"gpu.max_clock_mhz = {cap_mhz} is above GPU {i}'s maximum SM clock {top} MHz; "
                                   f"set it to {top} or less (or 0 for no cap)")
        low, source = lowest_clock(nvml, h)
        caps.append(Cap(i, min(low, cap_mhz), cap_mhz, source))
    return caps


def _locked(c: Cap) -> str:
    note = f" (NVML names no lowest clock: floor {FALLBACK_FLOOR_MHZ} MHz)" if c.floor_from == "fallback" else ""
    return f"GPU {c.index}: SM clock locked to {c.min_mhz}-{c.max_mhz} MHz{note}"


def apply(cap_mhz: int, marker: Path = MARKER, nvml: Any = None) -> str:
    if cap_mhz == 0:
        if marker.exists():
            return "no cap set; " + reset(marker, nvml)
        return "no cap set (gpu.max_clock_mhz = 0): clocks left as they are"
    nvml = nvml or _nvml()
    caps = plan(nvml, cap_mhz)
    applied = []
    try:
        for c in caps:
            nvml.nvmlDeviceSetGpuLockedClocks(nvml.nvmlDeviceGetHandleByIndex(c.index), c.min_mhz, c.max_mhz)
            applied.append(c)
    except nvml.NVMLError as e:
        for c in applied:  # all or nothing
            _reset_one(nvml, c.index)
        raise RequirementError(f"could not cap GPU {len(applied)}'s SM clock at {cap_mhz} MHz ({e}); "
                               "this needs root (the unit's ExecStartPre=+ runs it so): "
                               "fix that or set gpu.max_clock_mhz = 0") from None
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"gpus": [c.index for c in caps], "max_mhz": cap_mhz}) + "\n")
    return "; ".join(_locked(c) for c in caps)


def _reset_one(nvml: Any, index: int) -> str | None:
    try:
        nvml.nvmlDeviceResetGpuLockedClocks(nvml.nvmlDeviceGetHandleByIndex(index))
    except nvml.NVMLError as e:
        return f"GPU {index}: {e}"
    return None


def reset(marker: Path = MARKER, nvml: Any = None) -> str:
    if not marker.exists():
        return "no cap of ours is on: nothing to reset"
    try:
        gpus = read_json(marker)["gpus"]
    except (ValueError, KeyError, TypeError):
        gpus = None  # unreadable: reset every GPU (ours was on all of them)
    nvml = nvml or _nvml()
    if gpus is None:
        gpus = list(range(nvml.nvmlDeviceGetCount()))
    failed = [f for f in (_reset_one(nvml, i) for i in gpus) if f]
    if failed:
        raise UserError(f"could not reset the SM clock lock: {'; '.join(failed)}; "
                        "run `sudo nvidia-smi -rgc` by hand")
    marker.unlink()
    return f"SM clock lock reset on GPU {', '.join(map(str, gpus))}"


def cmd_gpu_clock(args: argparse.Namespace) -> int:
    from .service.config import load_settings, resolve_config_path

    if args.action == "reset":
        print(f"gpu-clock: {reset()}")
        return EXIT_OK
    try:
        settings = load_settings(resolve_config_path(args.config), must_exist=False)
    except ConfigError as e:
        # `serve` reports it next and exits 2, which the unit knows not to retry: leave it to serve.
        print(f"gpu-clock: settings unusable, nothing applied ({e})")
        return EXIT_OK
    print(f"gpu-clock: {apply(settings.gpu.max_clock_mhz)}")
    sys.stdout.flush()
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpu-clock", help="apply or reset the gpu.max_clock_mhz cap (the unit runs it as root)")
    p.add_argument("action", choices=("apply", "reset"))
    p.add_argument("--config", help=CONFIG_HELP)
    p.set_defaults(func=cmd_gpu_clock)
