"""The service's NVML reader (gptoss_spark/service/gpu.py) against a real GPU's NVML, as JSON.

What the supervisor would publish on this host: every figure per GPU (None = NVML does not give
it here), read a few times while an optional CUDA load runs, so clocks, power and utilization
move; and, with --cap, the clock cap of gptoss_spark/gpuclock.py applied, read back and reset
(needs root). Needs only nvidia-ml-py (pure Python) and the driver; --load needs torch with CUDA.
The engine-memory lookup is given --pid (default: this process, which runs the load), as the
supervisor gives it the engine's process tree; the output records nvidia-ml-py's version.

    python benchmarks/gpu_telemetry/read_nvml.py --out results.json [--load 10] [--cap 1500] [--pid PID]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gptoss_spark.service.gpu import NvmlReader, gpu_line  # noqa: E402


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def busy(seconds: float, stop: threading.Event) -> str | None:
    try:
        import torch
    except ImportError:
        return "torch not installed: no load"
    if not torch.cuda.is_available():
        return "torch has no CUDA: no load"
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end and not stop.is_set():
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the JSON here too")
    ap.add_argument("--load", type=float, default=0.0, help="seconds of bf16 matmul load while sampling")
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--cap", type=int, default=0, help="also apply, read and reset an SM clock cap (MHz; root)")
    ap.add_argument("--pid", type=int, action="append",
                    help="a pid whose device memory to count as the engine's (repeatable; default: this process)")
    args = ap.parse_args()
    pids = args.pid or [os.getpid()]

    reader = NvmlReader()
    result: dict = {"host": platform.node(), "machine": platform.machine(),
                    "nvidia_ml_py": _version("nvidia-ml-py"), "engine_pids": pids, "samples": []}
    stop = threading.Event()
    load_note: list[str | None] = []
    worker = None
    if args.load:
        worker = threading.Thread(target=lambda: load_note.append(busy(args.load, stop)), daemon=True)
        worker.start()
        time.sleep(1.0)
    t0 = time.monotonic()
    for _ in range(args.samples):
        start = time.perf_counter()
        r = reader.read(pids)
        result["samples"].append({"t": round(time.monotonic() - t0, 2),
                                  "read_ms": round((time.perf_counter() - start) * 1000, 2),
                                  "line": gpu_line(r), **r.to_json()})
        time.sleep(max(0.0, (args.load or args.samples) / args.samples - 0.05))
    if worker is not None:
        stop.set()
        worker.join()
        result["load"] = load_note[0] if load_note and load_note[0] else f"{args.load:g} s bf16 8192^2 matmul"
    if args.cap:
        from gptoss_spark import gpuclock

        marker = Path("/tmp/gptoss-spark-read-nvml-cap.json")
        cap: dict = {"max_mhz": args.cap}
        try:
            cap["apply"] = gpuclock.apply(args.cap, marker)
            time.sleep(1.0)
            cap["while_capped"] = reader.read(pids).to_json()
        except Exception as e:  # noqa: BLE001 (reported, and the reset still runs)
            cap["error"] = f"{type(e).__name__}: {e}"
        finally:
            if marker.exists():
                cap["reset"] = gpuclock.reset(marker)
        cap["after_reset"] = reader.read(pids).to_json()
        result["cap"] = cap
    reader.close()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    first = result["samples"][0]
    return 0 if first.get("available") else 1


if __name__ == "__main__":
    sys.exit(main())
