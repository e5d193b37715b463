"""`gptoss-spark loadtest --sweep 1,2,5,...`: the load test at each concurrency in turn, for a bounded time each.

At each point, C users start together and each sends its requests back to back
until the point's time is up (`--sweep-seconds`); the requests in flight then
finish (each is bounded by --max-tokens and --timeout), so a point lasts the
time plus at most one request. Every user sends at least one request. Per point:
aggregate tok/s (completion tokens of successful requests / first send to last
end), per-user tok/s (each request's decode rate, median over the point) and TTFT
p50/p95. Written as JSON (the whole result), CSV (one row per point) and a PNG
(sweep_plot.py). `bench ab --sweep` runs the same on each profile and recommends
one per load range (recommend_by_range).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

from ..base.errors import UserError
from . import speculation
from .prompts import Prompt
from .request import RequestRecord, RequestSpec, send_streamed
from .single import RESULT_SCHEMA, http_client, protocol_record, result_header, warm_up
from .stats import describe, max_concurrency, percentile
from .target import Target

RESULT_KIND_SWEEP = "gptoss-spark.sweep"
DEFAULT_SECONDS = 60.0
MAX_CONCURRENCY = 1024
# Within this share of the best aggregate at a concurrency, profiles tie (bench ab's own NOISE).
TIE = 0.03


def parse_concurrencies(text: str) -> list[int]:
    """'1,2,5,10' -> [1, 2, 5, 10]: whole numbers 1..1024, ascending, each once."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--sweep {text!r}: list whole numbers separated by commas, e.g. --sweep 1,2,5,10,32") from None
    if not values or min(values) < 1 or max(values) > MAX_CONCURRENCY:
        raise UserError(f"--sweep {text!r}: concurrencies must be 1 to {MAX_CONCURRENCY}, e.g. --sweep 1,2,5,10,32")
    if values != sorted(set(values)):
        raise UserError(f"--sweep {text!r}: list each concurrency once, ascending, e.g. --sweep 1,2,5,10,32")
    return values


async def run_point(client, target: Target, spec: RequestSpec, prompts: list[Prompt], users: int, seconds: float,
                    t0: float, say) -> tuple[list[RequestRecord], float, float]:
    """C users back to back until `seconds` have passed since the point began; returns (records, start, end)."""
    records: list[RequestRecord] = []
    start = time.perf_counter() - t0
    deadline = start + seconds

    async def user(u: int) -> None:
        n = 0
        while n == 0 or time.perf_counter() - t0 < deadline:
            prompt = prompts[(u + n * users) % len(prompts)]
            rec = RequestRecord(index=len(records), prompt_id=prompt.id, user=u)
            records.append(rec)
            await send_streamed(client, target.base_url, spec, prompt, rec, t0)
            n += 1
            say(f"{users} users: {sum(r.ended_at is not None for r in records)} requests done")

    await asyncio.gather(*(user(u) for u in range(users)))
    return records, start, time.perf_counter() - t0


def point_summary(users: int, records: list[RequestRecord], start: float, end: float, spec_counts: dict | None) -> dict:
    counted = [r for r in records if r.error is None and r.completion_tokens is not None]
    valid = [r for r in records if r.valid]
    tokens = sum(r.completion_tokens for r in counted)
    makespan = end - start
    ttfts = [r.ttft_s for r in records if r.error is None and r.ttft_s is not None]
    per_user = describe([r.decode_tok_s for r in valid])
    return {
        "concurrency": users,
        "requests": len(records),
        "valid_requests": len(valid),
        "invalid_requests": len(records) - len(valid),
        "completion_tokens_total": tokens,
        "makespan_s": makespan,
        "aggregate_tok_s": tokens / makespan if makespan > 0 and counted else None,
        "per_user_tok_s": per_user["median"],
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "observed_concurrency": max_concurrency([(r.first_output_at, r.last_output_at) for r in valid]) if valid else 0,
        "speculation": spec_counts,
        "invalid_reasons": sorted({r.invalid_reason for r in records if not r.valid and r.invalid_reason}),
    }


async def _sweep(target: Target, spec: RequestSpec, prompts: list[Prompt], concurrencies: list[int], seconds: float,
                 warmup: int, timeout: float, say) -> tuple[list[RequestRecord], list[dict]]:
    points = []
    async with http_client(timeout, connections=max(concurrencies) + 2, headers=target.headers) as client:
        t0 = time.perf_counter()
        warm = await warm_up(client, target, spec, warmup, t0, say)
        for c in concurrencies:
            say(f"{c} users: starting ({seconds:g} s)")
            before = speculation.read_counters(target.base_url, target.headers)
            records, start, end = await run_point(client, target, spec, prompts, c, seconds, t0, say)
            after = speculation.read_counters(target.base_url, target.headers)
            points.append(point_summary(c, records, start, end, speculation.acceptance(before, after)))
    return warm, points


def run_sweep(target: Target, spec: RequestSpec, prompts: list[Prompt], prompts_source: str,
              concurrencies: list[int], seconds: float, warmup: int, timeout: float, host_snapshot, progress=None) -> dict:
    """The sweep's result dict; host_snapshot() is called once the points are done."""
    if seconds <= 0:
        raise UserError(f"--sweep-seconds must be positive, got {seconds:g}")
    say = progress or (lambda text: None)
    started = datetime.now(timezone.utc)
    warm, points = asyncio.run(_sweep(target, spec, prompts, concurrencies, seconds, warmup, timeout, say))
    return {
        **result_header(RESULT_KIND_SWEEP, target, started),
        "protocol": protocol_record(spec, prompts_source, concurrencies=concurrencies, seconds_per_point=seconds,
                                    warmup=warmup,
                                    aggregate="completion tokens of successful requests / point makespan "
                                              "(first send to last end)"),
        "points": points,
        "invalid_requests": sum(p["invalid_requests"] for p in points),
        "warmup": [r.to_json() for r in warm],
        "host": host_snapshot(),
    }


ONE_CHUNK_HINT = ("every request arrived as one chunk, so per-token timing is impossible: a random-weight model "
                  "(the demo) answers chat this way; sweep it with --endpoint completions")


def point_validity(point: dict) -> str:
    """'valid', 'partly invalid' or 'all invalid': how far a point's figures can be trusted."""
    if point["invalid_requests"] == 0:
        return "valid"
    return "all invalid" if point["valid_requests"] == 0 else "partly invalid"


def sweep_warning(result: dict) -> str | None:
    """The line a sweep must lead with when none of its requests was valid (None otherwise)."""
    points = result.get("points") or []
    total = sum(p["requests"] for p in points)
    if not points or any(p["valid_requests"] for p in points):
        return None
    reasons = {r for p in points for r in p["invalid_reasons"]}
    why = ONE_CHUNK_HINT if reasons and all("in one chunk" in r for r in reasons) else \
        "reasons below each point"
    return f"ALL {total} REQUESTS OF THIS SWEEP WERE INVALID: its figures are not measurements ({why})"


def recommend_by_range(sweeps: dict[str, dict]) -> list[dict]:
    """Per concurrency, the profile with the highest aggregate tok/s (ties within TIE go to the better TTFT p95),
    merged into ranges of neighbouring concurrencies with the same winner.

    sweeps: profile -> sweep result (None for a profile not measured). Points with invalid requests do not
    compete. Returns [{from, to, profile, aggregate_tok_s: {profile: value}, why}] in ascending order.
    """
    table: dict[int, dict[str, dict]] = {}
    for name, res in sweeps.items():
        for p in (res or {}).get("points", []):
            table.setdefault(p["concurrency"], {})[name] = p
    ranges: list[dict] = []
    for c in sorted(table):
        usable = {n: p for n, p in table[c].items() if p["invalid_requests"] == 0 and p["aggregate_tok_s"]}
        if not usable:
            best, why = None, "no profile served every request at this concurrency"
        else:
            top = max(p["aggregate_tok_s"] for p in usable.values())
            close = [n for n, p in usable.items() if p["aggregate_tok_s"] >= (1 - TIE) * top]
            best = min(close, key=lambda n: (usable[n]["ttft_p95_s"] or float("inf"), n))
            others = ", ".join(f"{n} {p['aggregate_tok_s']:.1f}" for n, p in sorted(usable.items()) if n != best)
            why = f"{best} {usable[best]['aggregate_tok_s']:.1f} tok/s" + (f" (vs {others})" if others else "")
            if len(close) > 1:
                why += f"; {', '.join(sorted(close))} within {TIE:.0%}: the lower TTFT p95 wins"
        agg = {n: p["aggregate_tok_s"] for n, p in table[c].items()}
        if ranges and ranges[-1]["profile"] == best:
            ranges[-1].update(to=c)
            ranges[-1]["points"].append({"concurrency": c, "aggregate_tok_s": agg, "why": why})
        else:
            ranges.append({"from": c, "to": c, "profile": best,
                           "points": [{"concurrency": c, "aggregate_tok_s": agg, "why": why}]})
    return ranges


def render_ranges(ranges: list[dict]) -> list[str]:
    lines = []
    for r in ranges:
        users = f"{r['from']} user{'s' if r['from'] > 1 else ''}" if r["from"] == r["to"] else \
            f"{r['from']}-{r['to']} users"
        lines.append(f"  {users}: {r['profile'] or 'none'}  ({'; '.join(p['why'] for p in r['points'])})")
    return lines
