"""The whole prebuild of a profile's FlashInfer modules, as the installer runs it, with each job's peak memory.

    python3 benchmarks/flashinfer_prebuild/parallel_build.py --state-dir DIR [--profile plain]
        [--jobs N] [--deadline SECONDS] [--out FILE.json]

Runs `gptoss-spark flashinfer build --profile P` (the installer's own step: its module list, its
job rule, its cache layout) and, while it runs, samples /proc every 0.2 s: for each compile job
(a child of ninja) the peak RSS summed over its process tree (nvcc, cicc, ptxas, ...), and the
peak over all jobs together. The build resumes where it stopped (ninja and the cache key), so
with --deadline it can be spread over several calls with the same --state-dir; each call's
samples are merged into --out. At the end: the .ninja_log of each module through summarize.py
(per-file seconds by class), the cache's size, and the built markers.

A cross-compile for 12.1a on whatever host runs it: not a Spark figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gptoss_spark.service import flashinfer_cache as cache  # noqa: E402
from summarize import summarize  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, rss bytes, comm) for every readable process."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            rss_pages = int(Path(f"/proc/{entry.name}/statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        comm = stat[stat.index("(") + 1: stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        out[int(entry.name)] = (ppid, rss_pages * PAGE, comm)
    return out


def job_output(pid: int) -> str:
    """The object a compile job writes: the word after -o in its command line (else its pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return str(pid)
    words = argv.replace("\0", " ").split()
    if "-o" in words[:-1]:
        return words[words.index("-o") + 1].rsplit("/", 1)[-1]
    return str(pid)


class JobSampler(threading.Thread):
    """Peak RSS per ninja job (its whole process tree) and of all jobs together."""

    def __init__(self, interval: float = 0.2):
        super().__init__(daemon=True)
        self.interval = interval
        self.stop = threading.Event()
        self.per_job: dict[str, int] = {}
        self.peak_total = 0
        self.peak_jobs = 0
        self.names: dict[int, str] = {}

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            procs = processes()
            children: dict[int, list[int]] = {}
            for pid, (ppid, _, _) in procs.items():
                children.setdefault(ppid, []).append(pid)

            def tree_rss(pid: int) -> int:
                return procs[pid][1] + sum(tree_rss(c) for c in children.get(pid, ()))

            total = jobs = 0
            for ninja in (p for p, (_, _, comm) in procs.items() if comm == "ninja"):
                for job in children.get(ninja, ()):
                    if job not in self.names:
                        self.names[job] = job_output(job)
                    rss = tree_rss(job)
                    key = self.names[job]
                    self.per_job[key] = max(self.per_job.get(key, 0), rss)
                    total += rss
                    jobs += 1
            self.peak_total = max(self.peak_total, total)
            self.peak_jobs = max(self.peak_jobs, jobs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--profile", default="plain")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--deadline", type=float, help="stop the build (SIGINT) after this many seconds")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("parallel_build.json"))
    args = ap.parse_args(argv)

    state = args.state_dir.resolve()
    (state / "profiles").mkdir(parents=True, exist_ok=True)
    for p in ("plain", "spec"):
        (state / "profiles" / f"{p}.toml").write_text((REPO / "etc" / "profiles" / f"{p}.toml").read_text())
    cfg = state / "gs.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{state}"\nprofile_dirs = ["{state / "profiles"}"]\n')
    env = {**os.environ, "CUDA_HOME": str(cache.cuda_home()),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [sys.executable, "-m", "gptoss_spark.cli", "flashinfer", "build", "--config", str(cfg),
           "--profile", args.profile, *(["--jobs", str(args.jobs)] if args.jobs else [])]

    previous = json.loads(args.out.read_text()) if args.out.is_file() else {"calls": [], "per_job_peak_gib": {}}
    sampler = JobSampler()
    sampler.start()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True)
    try:
        rc = proc.wait(timeout=args.deadline)
        stopped = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # ninja stops its jobs; the finished objects stay for the next call
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        stopped = True
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()

    key = cache.current_key(env)
    root = state / "cache" / "flashinfer"
    modules = {}
    for bdir in sorted(key.workspace_base(root).glob(".cache/flashinfer/*/121a/cached_ops/*")):
        if (bdir / "build.ninja").is_file():
            modules[bdir.name] = summarize(bdir)
    cache_bytes = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.is_dir() else 0
    per_job = {**previous["per_job_peak_gib"], **{k: round(v / 2**30, 2) for k, v in sampler.per_job.items()}}
    result = {
        "host": f"{platform.machine()}, {os.cpu_count()} cores",
        "mem_total_gib": round(int(Path("/proc/meminfo").read_text().split()[1]) / 2**20, 1),
        "nvcc": key.nvcc, "flashinfer": key.flashinfer, "arch": "12.1a", "profile": args.profile,
        "command": " ".join(cmd[1:]),
        "calls": [*previous["calls"], {"rc": rc, "stopped_at_deadline": stopped, "wall_seconds": round(wall, 1),
                                       "peak_all_jobs_gib": round(sampler.peak_total / 2**30, 2),
                                       "most_jobs_at_once": sampler.peak_jobs}],
        "per_job_peak_gib": per_job,
        "largest_job_gib": max(per_job.values(), default=0.0),
        "cache_mib": round(cache_bytes / 2**20, 1),
        "modules": modules,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("per_job_peak_gib", "modules")}, indent=1))
    for name, m in modules.items():
        print(name, f"{m['built']}/{m['targets']} built, {m['compile_seconds_measured']} s of compile", flush=True)
    return 0 if rc == 0 or stopped else rc


if __name__ == "__main__":
    sys.exit(main())
