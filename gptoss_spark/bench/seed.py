"""The seed project's published figures (docs/HARDWARE.md, "The seed deployment's figures").

These are the seed's numbers, measured by the seed on a DGX Spark with its own
Docker image (vLLM 0.28.1rc1 nightly + patches). Nothing in this repository
measured them; every place that shows them labels them as the seed's.
"""

from __future__ import annotations

SEED_LABEL = "seed's Spark figure (luka-loehr/gptoss-spark 0.2.0, not measured here)"

# Seed protocol: 4 requests x 512 tokens, temperature 0, reasoning_effort low,
# streamed chat completions, decode median.
SEED_PROTOCOL = ("chat", 512, "low", False)  # endpoint, max_tokens, reasoning_effort, ignore_eos
SEED_SINGLE_STREAM_TOK_S = {"plain": 64.3, "spec": 68.9}

# 30 concurrent users, plain profile only.
SEED_LOADTEST = {"plain": {"users": 30, "aggregate_tok_s": 299.5, "ttft_p50_s": 1.2}}
