"""CLI: `gptoss-spark bench [compare A B]` and `gptoss-spark loadtest`.

Exit codes: 0 every measured request valid; 1 some request invalid (the
result still prints, with each reason); 2 bad input; 3 endpoint unreachable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from ..errors import UserError
from .compare import compare, load_result
from .load import loadtest_result, run_load
from .prompts import load_prompts, shipped_prompts_path
from .render import Progress, render_bench, render_compare, render_loadtest
from .request import ENDPOINTS, RequestSpec
from .single import bench_result, run_single_stream
from .snapshot import DEFAULT_ADMIN_URL, host_snapshot
from .target import DEFAULT_BASE_URL, resolve_target


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def _add_common(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--url", default=DEFAULT_BASE_URL, help=f"OpenAI-compatible endpoint (default {DEFAULT_BASE_URL})")
    p.add_argument("--model", help="served model name (default: gptoss, or the only model served)")
    p.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="chat",
                   help="chat = the seed protocol; completions = raw decode, no chat template (default chat)")
    p.add_argument("--max-tokens", type=_int_at_least(2), default=max_tokens, help=f"per request (default {max_tokens})")
    p.add_argument("--reasoning-effort", choices=["low", "medium", "high", "none"], default="low",
                   help="chat only; 'none' leaves it out of the request (default low, as the seed)")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens (vLLM extension)")
    p.add_argument("--prompts", type=Path, help=f"JSONL prompts file (default: shipped {shipped_prompts_path().name})")
    p.add_argument("--prompt", dest="prompt_ids", action="append", metavar="ID",
                   help="use only this prompt id (repeatable)")
    p.add_argument("--warmup", type=_int_at_least(0), default=1, help="unmeasured requests first (default 1)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds to wait for the next chunk before a request counts as failed (default 300)")
    p.add_argument("--admin-url", default=DEFAULT_ADMIN_URL, help="admin API, for the active profile in the snapshot")
    p.add_argument("--json", action="store_true", help="print the JSON result instead of the table")
    p.add_argument("--out", type=Path, help="also write the JSON result to this file (input for `bench compare`)")
    p.add_argument("--no-progress", action="store_true", help="no progress line even on a terminal")


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="single-stream benchmark (the seed's protocol)",
                           description="Streamed requests one at a time after warm-up; decode rate and TTFT. "
                                       "`bench compare A.json B.json` puts two results side by side.")
    _add_common(bench, max_tokens=512)
    bench.add_argument("--requests", type=_int_at_least(1), default=4, help="measured requests (default 4, as the seed)")
    bench.set_defaults(func=cmd_bench)
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="compare", required=False)
    cmp = bench_sub.add_parser("compare", help="two results side by side, with B/A ratios")
    cmp.add_argument("a", type=Path, help="result A (baseline)")
    cmp.add_argument("b", type=Path, help="result B")
    cmp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    cmp.set_defaults(func=cmd_compare)

    load = sub.add_parser("loadtest", help="N concurrent users: aggregate tok/s, TTFT p50/p90",
                          description="All users start together; each sends its requests back to back.")
    _add_common(load, max_tokens=512)
    load.add_argument("--users", type=_int_at_least(1), default=30, help="concurrent users (default 30, as the seed)")
    load.add_argument("--requests-per-user", type=_int_at_least(1), default=1, help="(default 1)")
    load.set_defaults(func=cmd_loadtest)


def _prepare(args):
    if args.timeout <= 0:
        raise UserError(f"--timeout must be positive, got {args.timeout}")
    prompts = load_prompts(args.prompts)
    if args.prompt_ids:
        known = {p.id for p in prompts}
        missing = [i for i in args.prompt_ids if i not in known]
        if missing:
            raise UserError(f"unknown prompt id(s) {missing}; ids in the file: {sorted(known)}")
        prompts = [p for p in prompts if p.id in set(args.prompt_ids)]
    target = resolve_target(args.url, args.model)
    if target.max_model_len and args.max_tokens >= target.max_model_len:
        raise UserError(f"--max-tokens {args.max_tokens} does not fit the served max_model_len {target.max_model_len}; lower it")
    spec = RequestSpec(
        endpoint=args.endpoint,
        model=target.model,
        max_tokens=args.max_tokens,
        reasoning_effort=None if args.reasoning_effort == "none" else args.reasoning_effort,
        ignore_eos=args.ignore_eos,
    )
    source = str(args.prompts) if args.prompts else f"shipped:{shipped_prompts_path().name}"
    if args.prompt_ids:
        source += " [" + ",".join(args.prompt_ids) + "]"
    return prompts, target, spec, source


def _emit(result: dict, args, human: str) -> None:
    if args.out:
        try:
            args.out.write_text(json.dumps(result, indent=2) + "\n")
        except OSError as e:
            raise UserError(f"cannot write {args.out}: {e.strerror}; pass --out with a writable path") from None
    print(json.dumps(result, indent=2) if args.json else human, end="\n" if args.json else "")


def cmd_bench(args) -> int:
    prompts, target, spec, source = _prepare(args)
    started = datetime.now(timezone.utc)
    progress = Progress(enabled=False if args.no_progress else None)
    try:
        warm, measured, wall = asyncio.run(
            run_single_stream(target, spec, prompts, args.requests, args.warmup, args.timeout, progress))
    finally:
        progress.close()
    host = host_snapshot(args.admin_url, target.server_version)
    result = bench_result(target, spec, source, args.requests, args.warmup, warm, measured, wall, host, started)
    _emit(result, args, render_bench(result))
    return 0 if result["summary"]["invalid_requests"] == 0 else 1


def cmd_loadtest(args) -> int:
    prompts, target, spec, source = _prepare(args)
    started = datetime.now(timezone.utc)
    progress = Progress(enabled=False if args.no_progress else None)
    try:
        warm, measured, start, end = asyncio.run(
            run_load(target, spec, prompts, args.users, args.requests_per_user, args.warmup, args.timeout, progress))
    finally:
        progress.close()
    host = host_snapshot(args.admin_url, target.server_version)
    result = loadtest_result(target, spec, source, args.users, args.requests_per_user, args.warmup,
                             warm, measured, start, end, host, started)
    _emit(result, args, render_loadtest(result))
    return 0 if result["summary"]["invalid_requests"] == 0 else 1


def cmd_compare(args) -> int:
    a, b = load_result(args.a), load_result(args.b)
    cmp = compare(a, b)
    if args.json:
        print(json.dumps(cmp, indent=2))
    else:
        sys.stdout.write(render_compare(cmp, str(args.a), str(args.b)))
    return 0
