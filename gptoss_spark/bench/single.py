"""`gptoss-spark bench`: the seed's single-stream protocol (docs/HARDWARE.md).

Warm-up request(s) first (not measured: the first request after a start pays
for compilation and cache fills), then N measured requests one after another,
each streamed; the headline is the median decode rate of the valid ones.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import httpx

from .prompts import Prompt
from .request import RequestRecord, RequestSpec, send_streamed
from .stats import describe
from .target import Target

RESULT_KIND_BENCH = "gptoss-spark.bench"
RESULT_SCHEMA = 1
WARMUP_MAX_TOKENS = 64
# Not in the prompts file, so the measured prompts never hit a prefix cache
# the warm-up filled.
WARMUP_PROMPT = Prompt(
    id="warmup",
    messages=({"role": "user", "content": "Say hello and name three colours."},),
    prompt="The three primary colours are",
)


def http_client(timeout: float, connections: int = 4, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    # read= is the longest gap between two chunks: a cold engine's first token
    # can take minutes, so it is the user's knob (--timeout). connect= too: an engine busy on
    # its one CPU core accepts late (a fixed 10 s failed load-test requests that --timeout,
    # which the error names, could not help).
    return httpx.AsyncClient(
        timeout=httpx.Timeout(connect=timeout, read=timeout, write=30.0, pool=None),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        headers=headers,
    )


async def run_single_stream(
    target: Target,
    spec: RequestSpec,
    prompts: list[Prompt],
    requests: int,
    warmup: int,
    timeout: float,
    progress=None,
) -> tuple[list[RequestRecord], list[RequestRecord], float]:
    """Returns (warm-up records, measured records, wall seconds)."""
    say = progress or (lambda text: None)
    measured: list[RequestRecord] = []
    async with http_client(timeout, headers=target.headers) as client:
        t0 = time.perf_counter()
        warm = await warm_up(client, target, spec, warmup, t0, say)
        for i in range(requests):
            prompt = prompts[i % len(prompts)]
            say(f"request {i + 1}/{requests} ({prompt.id})" + _last_rate(measured))
            rec = RequestRecord(index=i, prompt_id=prompt.id)
            await send_streamed(client, target.base_url, spec, prompt, rec, t0)
            measured.append(rec)
        wall = time.perf_counter() - t0
    say(f"done: {sum(r.valid for r in measured)}/{requests} valid" + _last_rate(measured))
    return warm, measured, wall


async def warm_up(client: httpx.AsyncClient, target: Target, spec: RequestSpec, n: int, t0: float, say) -> list[RequestRecord]:
    """n short unmeasured requests, one after another; their records are kept in the result."""
    warm = []
    for i in range(n):
        say(f"warm-up {i + 1}/{n}")
        rec = RequestRecord(index=i, prompt_id=WARMUP_PROMPT.id, warmup=True)
        await send_streamed(client, target.base_url, spec, WARMUP_PROMPT, rec, t0,
                            max_tokens=min(WARMUP_MAX_TOKENS, spec.max_tokens))
        warm.append(rec)
    return warm


def _last_rate(records: list[RequestRecord]) -> str:
    if not records:
        return ""
    r = records[-1]
    return f"  last: {r.decode_tok_s:.1f} tok/s" if r.valid else f"  last: invalid ({r.invalid_reason[:60]})"


def bench_result(
    target: Target,
    spec: RequestSpec,
    prompts_source: str,
    requests: int,
    warmup: int,
    warm: list[RequestRecord],
    measured: list[RequestRecord],
    wall_s: float,
    host: dict,
    started_at: datetime,
) -> dict:
    valid = [r for r in measured if r.valid]
    return {
        **result_header(RESULT_KIND_BENCH, target, started_at),
        "protocol": protocol_record(spec, prompts_source, requests=requests, warmup=warmup),
        "summary": {
            "requests": len(measured),
            "valid_requests": len(valid),
            "invalid_requests": len(measured) - len(valid),
            "decode_tok_s": describe([r.decode_tok_s for r in valid]),
            "ttft_s": describe([r.ttft_s for r in valid]),
            "completion_tokens": describe([r.completion_tokens for r in valid]),
            "wall_s": wall_s,
        },
        "invalid": [{"index": r.index, "reason": r.invalid_reason} for r in measured if not r.valid],
        "requests": [r.to_json() for r in measured],
        "warmup": [r.to_json() for r in warm],
        "host": host,
    }


def result_header(kind: str, target: Target, started_at: datetime) -> dict:
    """The fields every bench / loadtest result starts with: what, which schema, when, against what."""
    return {
        "kind": kind,
        "schema": RESULT_SCHEMA,
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "target": {
            "base_url": target.base_url,
            "model": target.model,
            "max_model_len": target.max_model_len,
            "server_version": target.server_version,
        },
    }


def protocol_record(spec: RequestSpec, prompts_source: str, **extra) -> dict:
    """The settings that make two results comparable (`bench compare` lists differences)."""
    return {
        "endpoint": spec.endpoint,
        "max_tokens": spec.max_tokens,
        "temperature": spec.temperature,
        "reasoning_effort": spec.reasoning_effort if spec.endpoint == "chat" else None,
        "ignore_eos": spec.ignore_eos,
        "prompts": prompts_source,
        "decode_rate": "(completion_tokens - 1) / (last output - first output), counts from the final usage",
        **extra,
    }
