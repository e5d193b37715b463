"""How many draft tokens vLLM accepted over a run, from its spec-decode counters, and whether that pays.

vLLM 0.32.0 exports, per engine, `vllm:spec_decode_num_drafts_total` (verification steps that had a
draft), `..._num_draft_tokens_total` and `..._num_accepted_tokens_total` (v1/spec_decode/metrics.py).
Read before and after a run, their differences give the acceptance rate (accepted / draft tokens)
and the tokens each step emits (1 + accepted / drafts).

When speculation pays: the seed's Spark figures (docs/HARDWARE.md) put a spec step (K = 1) at
25.1 ms against plain's 15.6 ms per token (64.3 tok/s), so a step must emit at least
25.1 / 15.6 ~ 1.6 tokens to beat plain. Below that the spec profile's slots are wasted.
"""

from __future__ import annotations

import httpx

from ..service.probes import parse_prometheus_sums

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED)
BREAK_EVEN_TOKENS_PER_STEP = 25.1 / (1000 / 64.3)  # ~1.61: the seed's spec step over its plain token


def parse_counters(text: str) -> dict[str, float] | None:
    """The three counters summed over engines, or None if the engine exports none (no speculation)."""
    if DRAFTS not in text:
        return None
    return parse_prometheus_sums(text, COUNTERS)


def read_counters(base_url: str, headers: dict[str, str] | None = None, timeout: float = 5.0) -> dict | None:
    """GET base_url/metrics; None when it does not answer or shows no speculation."""
    try:
        r = httpx.get(f"{base_url.rstrip('/')}/metrics", headers=headers or {}, timeout=timeout)
    except httpx.HTTPError:
        return None
    return parse_counters(r.text) if r.status_code == 200 else None


def acceptance(before: dict | None, after: dict | None) -> dict | None:
    """What the run's steps accepted; None without speculation on both sides."""
    if before is None or after is None:
        return None
    drafts, tokens, accepted = (after[k] - before[k] for k in COUNTERS)
    if drafts <= 0 or tokens <= 0:
        return {"drafts": drafts, "draft_tokens": tokens, "accepted_tokens": accepted, "acceptance_rate": None,
                "tokens_per_step": None, "pays": None, "note": "no drafts during the run"}
    per_step = 1 + accepted / drafts
    pays = per_step >= BREAK_EVEN_TOKENS_PER_STEP
    note = None if pays else (f"{per_step:.2f} tokens per step is below the ~{BREAK_EVEN_TOKENS_PER_STEP:.1f} at which "
                              "speculation beats plain on a Spark: check the draft head (`gptoss-spark draft verify "
                              "HEAD --target MODEL_DIR`) or use plain")
    return {"drafts": drafts, "draft_tokens": tokens, "accepted_tokens": accepted,
            "acceptance_rate": accepted / tokens, "tokens_per_step": per_step, "pays": pays, "note": note}


def render(spec: dict | None) -> list[str]:
    if spec is None:
        return []
    if spec["tokens_per_step"] is None:
        return ["", f"speculation: {spec['note']}"]
    line = (f"speculation: {spec['acceptance_rate']:.1%} of {spec['draft_tokens']:.0f} draft tokens accepted, "
            f"{spec['tokens_per_step']:.2f} tokens per step")
    return ["", line] + ([f"  {spec['note']}"] if spec["note"] else [])
