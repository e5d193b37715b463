"""`gptoss-spark loadtest`: N users at once, each sending its requests back to back.

aggregate = completion tokens of all successful requests / makespan (first
send to last end); TTFT percentiles over requests; per-user rate = each
request's decode rate as that user saw it.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

from .prompts import Prompt
from .request import RequestRecord, RequestSpec, send_streamed
from .single import http_client, protocol_record, result_header, warm_up
from .stats import describe, max_concurrency, percentile
from .target import Target

RESULT_KIND_LOADTEST = "gptoss-spark.loadtest"


async def run_load(
    target: Target,
    spec: RequestSpec,
    prompts: list[Prompt],
    users: int,
    requests_per_user: int,
    warmup: int,
    timeout: float,
    progress=None,
) -> tuple[list[RequestRecord], list[RequestRecord], float, float]:
    """Returns (warm-up records, measured records, load start, load end) with times since t0."""
    say = progress or (lambda text: None)
    total = users * requests_per_user
    finished: list[RequestRecord] = []
    async with http_client(timeout, connections=users + 2, headers=target.headers) as client:
        t0 = time.perf_counter()
        warm = await warm_up(client, target, spec, warmup, t0, say)

        async def user(u: int) -> None:
            for r in range(requests_per_user):
                index = u * requests_per_user + r
                prompt = prompts[index % len(prompts)]
                rec = RequestRecord(index=index, prompt_id=prompt.id, user=u)
                await send_streamed(client, target.base_url, spec, prompt, rec, t0)
                finished.append(rec)
                failed = sum(not x.valid for x in finished)
                say(f"{users} users: {len(finished)}/{total} done" + (f", {failed} invalid" if failed else ""))

        say(f"{users} users: 0/{total} done")
        start = time.perf_counter() - t0
        await asyncio.gather(*(user(u) for u in range(users)))
        end = time.perf_counter() - t0
    finished.sort(key=lambda rec: rec.index)
    return warm, finished, start, end


def loadtest_result(
    target: Target,
    spec: RequestSpec,
    prompts_source: str,
    users: int,
    requests_per_user: int,
    warmup: int,
    warm: list[RequestRecord],
    measured: list[RequestRecord],
    load_start: float,
    load_end: float,
    host: dict,
    started_at: datetime,
) -> dict:
    counted = [r for r in measured if r.error is None and r.completion_tokens is not None]
    valid = [r for r in measured if r.valid]
    tokens = sum(r.completion_tokens for r in counted)
    makespan = load_end - load_start
    ttfts = [r.ttft_s for r in measured if r.error is None and r.ttft_s is not None]
    decoding = [(r.first_output_at, r.last_output_at) for r in valid]
    return {
        **result_header(RESULT_KIND_LOADTEST, target, started_at),
        "protocol": protocol_record(spec, prompts_source, users=users, requests_per_user=requests_per_user, warmup=warmup,
                              aggregate="completion tokens of successful requests / makespan (first send to last end)"),
        "summary": {
            "requests": len(measured),
            "valid_requests": len(valid),
            "invalid_requests": len(measured) - len(valid),
            "makespan_s": makespan,
            "completion_tokens_total": tokens,
            "aggregate_tok_s": tokens / makespan if makespan > 0 and counted else None,
            "ttft_s": {"p50": percentile(ttfts, 50), "p90": percentile(ttfts, 90), "max": max(ttfts, default=None)},
            "per_user_decode_tok_s": describe([r.decode_tok_s for r in valid]),
            # Most requests whose decode windows overlapped: evidence from the
            # server's own output timing that the users were served at once.
            "observed_concurrency": max_concurrency(decoding) if decoding else 0,
        },
        "invalid": [{"index": r.index, "user": r.user, "reason": r.invalid_reason} for r in measured if not r.valid],
        "requests": [r.to_json() for r in measured],
        "warmup": [r.to_json() for r in warm],
        "host": host,
    }
