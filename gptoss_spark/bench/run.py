"""One measured run from the command-line options: shared by `bench`, `loadtest` and `bench ab`.

    prompts_for(args)           the prompts (--prompts, --prompt) and how the result names them
    request_spec(args, target)  the request settings, checked against what the server serves
    single_stream / load        run it, snapshot the host, build the result dict
    arena                       llama-benchy per point with the Spark Arena settings (bench arena)
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import datetime, timezone
from pathlib import Path

from ..base.errors import UserError
from . import arena as spark_arena
from . import benchy
from .load import loadtest_result, run_load
from .prompts import Prompt, load_prompts, shipped_prompts_path
from .render import Progress
from . import speculation
from . import sweep as load_sweep
from .request import RequestSpec
from .single import bench_result, run_single_stream
from .snapshot import host_snapshot
from .target import Target


def prompts_for(args) -> tuple[list[Prompt], str]:
    if args.timeout <= 0:
        raise UserError(f"--timeout must be positive, got {args.timeout}")
    prompts = load_prompts(args.prompts)
    if args.prompt_ids:
        known = {p.id for p in prompts}
        missing = [i for i in args.prompt_ids if i not in known]
        if missing:
            raise UserError(f"unknown prompt id(s) {missing}; ids in the file: {sorted(known)}")
        prompts = [p for p in prompts if p.id in set(args.prompt_ids)]
    source = str(args.prompts) if args.prompts else f"shipped:{shipped_prompts_path().name}"
    if args.prompt_ids:
        source += " [" + ",".join(args.prompt_ids) + "]"
    return prompts, source


def request_spec(args, target: Target) -> RequestSpec:
    if target.max_model_len and args.max_tokens >= target.max_model_len:
        raise UserError(f"--max-tokens {args.max_tokens} does not fit the served max_model_len {target.max_model_len}; lower it")
    return RequestSpec(
        endpoint=args.endpoint,
        model=target.model,
        max_tokens=args.max_tokens,
        reasoning_effort=None if args.reasoning_effort == "none" else args.reasoning_effort,
        ignore_eos=args.ignore_eos,
    )


def _progress(args) -> Progress:
    return Progress(enabled=False if args.no_progress else None)


def single_stream(args, prompts: list[Prompt], source: str, target: Target) -> dict:
    """`bench`: --warmup, then --requests one at a time."""
    spec = request_spec(args, target)
    started = datetime.now(timezone.utc)
    progress = _progress(args)
    before = speculation.read_counters(target.base_url)
    try:
        warm, measured, wall = asyncio.run(
            run_single_stream(target, spec, prompts, args.requests, args.warmup, args.timeout, progress))
    finally:
        progress.close()
    host = host_snapshot(args.admin_url, target.server_version)
    result = bench_result(target, spec, source, args.requests, args.warmup, warm, measured, wall, host, started)
    result["speculation"] = speculation.acceptance(before, speculation.read_counters(target.base_url))
    return result


def load(args, prompts: list[Prompt], source: str, target: Target) -> dict:
    """`loadtest`: --users at once, --requests-per-user each."""
    spec = request_spec(args, target)
    started = datetime.now(timezone.utc)
    progress = _progress(args)
    before = speculation.read_counters(target.base_url)
    try:
        warm, measured, start, end = asyncio.run(
            run_load(target, spec, prompts, args.users, args.requests_per_user, args.warmup, args.timeout, progress))
    finally:
        progress.close()
    host = host_snapshot(args.admin_url, target.server_version)
    result = loadtest_result(target, spec, source, args.users, args.requests_per_user, args.warmup,
                             warm, measured, start, end, host, started)
    result["speculation"] = speculation.acceptance(before, speculation.read_counters(target.base_url))
    return result


def sweep(args, prompts: list[Prompt], source: str, target: Target) -> dict:
    """`loadtest --sweep`: each concurrency of args.sweep in turn, --sweep-seconds each."""
    spec = request_spec(args, target)
    progress = _progress(args)
    try:
        return load_sweep.run_sweep(target, spec, prompts, source, args.sweep, args.sweep_seconds, args.warmup,
                                    args.timeout, lambda: host_snapshot(args.admin_url, target.server_version),
                                    progress)
    finally:
        progress.close()


def arena(args, target: Target, tokenizer: Path) -> dict:
    """`bench arena`: llama-benchy once per (depth, concurrency) point, the Spark Arena leaderboard's way."""
    points = spark_arena.schedule(args.depth, args.concurrency)
    corpus = benchy.shipped_corpus()
    s = benchy.Settings(base_url=target.base_url, model=target.model, tokenizer=tokenizer, corpus=corpus,
                        pp=args.pp, tg=args.tg, runs=args.runs, skip_coherence=args.skip_coherence,
                        timeout=args.timeout, api_key=target.api_key)
    protocol = {
        "tool": "llama-benchy", "llama_benchy": benchy.installed_version(), "profile": spark_arena.PROFILE_NAME,
        "pp": args.pp, "tg": args.tg, "runs": args.runs, "points": [list(p) for p in points],
        "enable_prefix_caching": True, "exit_on_first_fail": True, "latency_mode": "api",
        "skip_coherence": args.skip_coherence, "tokenizer": str(tokenizer),
        "corpus": f"shipped:{corpus.name} (sha256 {hashlib.sha256(corpus.read_bytes()).hexdigest()[:16]})",
    }
    protocol["differs_from_arena"] = spark_arena.same_as_arena(protocol)
    started = datetime.now(timezone.utc)
    progress = _progress(args)
    before = speculation.read_counters(target.base_url)
    done: list[dict] = []
    try:
        for i, (depth, conc) in enumerate(points):
            point = {"depth": depth, "concurrency": conc}
            if not spark_arena.fits(depth, args.pp, args.tg, target.max_model_len):
                done.append({**point, "ran": False, "exit_code": None, "figures": [], "llama_benchy": None, "log_tail": [],
                             "error": f"not run: depth {depth} + pp {args.pp} + tg {args.tg} tokens exceed the "
                                      f"served max_model_len {target.max_model_len}"})
                continue
            progress(f"point {i + 1}/{len(points)}: depth {depth}, concurrency {conc}")
            r = benchy.run_point(s, depth, conc)
            r["llama_benchy"] = r.pop("raw")  # its own JSON for this point, kept whole
            figs = spark_arena.figures(r["llama_benchy"], args.runs) if r["llama_benchy"] else []
            if r["error"]:
                for f in figs:
                    f.update(valid=False, invalid_reason=r["error"])
            done.append({**point, **r, "figures": figs})
    finally:
        progress.close()
    host = host_snapshot(args.admin_url, target.server_version)
    result = spark_arena.arena_result(target, protocol, done, host, started)
    result["speculation"] = speculation.acceptance(before, speculation.read_counters(target.base_url))
    return result
