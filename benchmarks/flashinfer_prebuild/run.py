"""Time the FlashInfer prebuild of the shipped profiles for 12.1a, one job, and extrapolate the MoE module.

    nice -n 10 .venv/bin/python benchmarks/flashinfer_prebuild/run.py [--out results.json] [--per-class N]

1. `gptoss-spark flashinfer build --module M --jobs 1` for the two small modules (sampling,
   fp4_quantization_*): whole builds, wall time and peak RSS from the build's marker.
2. fused_moe_120 (96 sources) takes hours on one core, so it is sampled: its build.ninja is written
   by the same worker, then N object files of each class (hand-written moe_gemm_kernels_*, other
   hand-written .cu, generated gemm sm90, grouped sm80, grouped sm120, .cpp) are compiled with
   ninja's own command lines (`ninja -t commands`), each timed with its peak RSS; the class mean
   times the class size gives the projection.

Needs what tests/integration/test_flashinfer_build.py needs (scripts/dev-setup.sh), plus cublas
headers (the nvidia-cublas wheel: pass its include dir with --extra-include). An x86 cross-compile
on whatever this box is: not a Spark figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gptoss_spark.service import flashinfer_cache as cache  # noqa: E402

CLASSES = (
    ("moe_gemm_kernels", re.compile(r"^moe_gemm_moe_gemm_kernels_")),
    ("generated gemm sm90", re.compile(r"^90_.*\.generated\.cuda\.o$")),
    ("generated grouped sm80", re.compile(r"^80_.*\.generated\.cuda\.o$")),
    ("generated grouped sm120", re.compile(r"^120_.*\.generated\.cuda\.o$")),
    ("other .cu", re.compile(r"\.cuda\.o$")),
    (".cpp", re.compile(r"\.o$")),
)


def classify(obj: str) -> str:
    return next(name for name, rx in CLASSES if rx.search(obj))


def timed(cmd: list[str] | str, env: dict[str, str], shell: bool = False) -> tuple[int, float, int]:
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, shell=shell, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, time.monotonic() - t0, usage.ru_maxrss * 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    ap.add_argument("--per-class", type=int, default=1)
    ap.add_argument("--extra-include", action="append", default=[])
    ap.add_argument("--libcuda-dir", default=str(Path(sys.prefix) / "opt" / "libcuda1"))
    args = ap.parse_args()

    nvidia = Path(__import__("nvidia").__path__[0]) / "cu13" / "include"
    inc = " ".join(f"-I{d}" for d in [*args.extra_include, nvidia])
    env = {**os.environ, "CUDA_HOME": str(cache.cuda_home()), "FLASHINFER_EXTRA_CUDAFLAGS": inc,
           "FLASHINFER_EXTRA_CFLAGS": inc, "FLASHINFER_EXTRA_LDFLAGS": f"-L{args.libcuda_dir}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    tmp = Path(tempfile.mkdtemp(prefix="fi-prebuild-"))
    (tmp / "profiles").mkdir()
    for p in ("plain", "spec"):
        (tmp / "profiles" / f"{p}.toml").write_text((REPO / "etc" / "profiles" / f"{p}.toml").read_text())
    cfg = tmp / "gs.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp / "state"}"\nprofile_dirs = ["{tmp / "profiles"}"]\n')
    key = cache.current_key(env)
    root = tmp / "state" / "cache" / "flashinfer"
    gs = [sys.executable, "-m", "gptoss_spark.cli", "flashinfer"]

    status = json.loads(subprocess.run([*gs, "status", "--config", str(cfg), "--json"], env=env, cwd=REPO,
                                       capture_output=True, text=True).stdout)
    names = sorted({m["name"] for m in status["modules"]})
    results: dict = {"host": f"{platform.machine()}, {os.cpu_count()} cores, {platform.node()}",
                     "nvcc": key.nvcc, "flashinfer": key.flashinfer, "arch": "12.1a", "jobs": 1, "modules": {}}
    for name in [n for n in names if n != "fused_moe_120"]:
        rc, secs, _ = timed([*gs, "build", "--config", str(cfg), "--module", name, "--jobs", "1"], env)
        if rc:
            raise SystemExit(f"{name} did not build; see {root}")
        mdir = key.module_dir(root, "12.1a", name)
        marker = json.loads((mdir / cache.BUILT_MARKER).read_text())
        results["modules"][name] = {"seconds": marker["seconds"], "peak_rss_gib": round(marker["peak_rss_bytes"] / 2**30, 2),
                                    "dir_mib": round(sum(f.stat().st_size for f in mdir.rglob("*") if f.is_file()) / 2**20, 1)}
        print(name, results["modules"][name], flush=True)

    # fused_moe_120: write its build.ninja through FlashInfer (no compile), then sample objects.
    wenv = {**env, "FLASHINFER_WORKSPACE_BASE": str(key.workspace_base(root)), "FLASHINFER_CUDA_ARCH_LIST": "12.1a"}
    code = ("from gptoss_spark.flashinfer_jit.worker import enter_flashinfer_jit, generator; enter_flashinfer_jit(); "
            "s = generator('flashinfer.jit.fused_moe:gen_cutlass_fused_moe_sm120_module')(); s.write_ninja(); "
            "print(s.ninja_path)")
    ninja_file = Path(subprocess.run([sys.executable, "-c", code], env=wenv, cwd=REPO, capture_output=True,
                                     text=True, check=True).stdout.strip().splitlines()[-1])
    bdir = ninja_file.parent
    objs = [line.split(":")[0].split("build ", 1)[1].rsplit("/", 1)[1] for line in ninja_file.read_text().splitlines()
            if line.startswith("build ") and (".cuda.o:" in line or line.split(":")[0].endswith(".o"))]
    by_class: dict[str, list[str]] = {}
    for o in objs:
        by_class.setdefault(classify(o), []).append(o)
    sample: dict = {}
    projected = 0.0
    for cls, members in by_class.items():
        times = []
        for o in members[: args.per_class]:
            cmd = subprocess.run(["ninja", "-C", str(bdir), "-f", str(ninja_file), "-t", "commands", str(bdir / o)],
                                 capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            cmd = cmd.replace(str(bdir / o), str(tmp / o))
            rc, secs, peak = timed(cmd, env, shell=True)
            if rc:
                raise SystemExit(f"{o} did not compile")
            times.append({"object": o, "seconds": round(secs, 1), "peak_rss_gib": round(peak / 2**30, 2)})
            print(cls, times[-1], flush=True)
        mean = sum(t["seconds"] for t in times) / len(times)
        projected += mean * len(members)
        sample[cls] = {"files": len(members), "sampled": times, "projected_seconds": round(mean * len(members))}
    results["fused_moe_120"] = {"objects": len(objs), "classes": sample, "projected_seconds_one_job": round(projected),
                                "note": "projection: class mean x class size, link not included"}
    results["maxrss_self_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
