"""How often the target emits each token: gathered from the served model or read from a file.

Counts file (JSON), as written by `gptoss-spark draft counts`:
    {"format": "gptoss-spark.token-counts", "vocab_size": 201088 | null,
     "total_tokens": N, "source": "...", "counts": {"<token id>": count, ...}}
Also accepted: a bare {"<token id>": count} object, or a list whose i-th
entry is the count of token i.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..base.errors import UserError
from ..base.fsutil import read_json

COUNTS_FORMAT = "gptoss-spark.token-counts"


@dataclass
class TokenCounts:
    counts: Counter
    vocab_size: int | None = None
    source: str = ""

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_json(self) -> dict:
        return {
            "format": COUNTS_FORMAT,
            "vocab_size": self.vocab_size,
            "total_tokens": self.total,
            "distinct_tokens": len(self.counts),
            "source": self.source,
            "counts": {str(k): v for k, v in sorted(self.counts.items())},
        }


def save_counts(counts: TokenCounts, path: Path) -> None:
    try:
        path.write_text(json.dumps(counts.to_json()) + "\n")
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror}; pass a writable --out path") from None


def load_counts(path: Path) -> TokenCounts:
    try:
        data = read_json(Path(path))
    except OSError as e:
        raise UserError(f"cannot read counts file {path}: {e.strerror}") from None
    except ValueError:
        raise UserError(f"counts file {path} is not JSON; write one with `gptoss-spark draft counts`") from None
    vocab_size = None
    if isinstance(data, dict) and data.get("format") == COUNTS_FORMAT:
        vocab_size = data.get("vocab_size")
        data = data.get("counts")
    counts: Counter = Counter()
    try:
        if isinstance(data, list):
            items = enumerate(data)
        elif isinstance(data, dict):
            items = ((int(k), v) for k, v in data.items())
        else:
            raise TypeError
        for tid, n in items:
            if isinstance(n, bool) or not isinstance(n, int) or n < 0 or tid < 0:
                raise ValueError(f"token {tid}: count {n!r}")
            if n:
                counts[tid] = n
    except (TypeError, ValueError) as e:
        detail = f" ({e})" if str(e) else ""
        raise UserError(
            f"counts file {path} is malformed{detail}; expected {{\"<token id>\": <count >= 0>}} "
            "or the output of `gptoss-spark draft counts`"
        ) from None
    if not counts:
        raise UserError(f"counts file {path} has no non-zero counts; gather them with `gptoss-spark draft counts`")
    return TokenCounts(counts=counts, vocab_size=vocab_size, source=str(path))


async def _gather(base_url: str, model: str, messages_list: list, max_tokens: int, temperature: float,
                  concurrency: int, timeout: float, progress, headers: dict[str, str]) -> Counter:
    counts: Counter = Counter()
    sem = asyncio.Semaphore(concurrency)
    done = 0
    url = base_url.rstrip("/") + "/v1/chat/completions"

    async def one(client: httpx.AsyncClient, messages) -> None:
        nonlocal done
        payload = {
            "model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": temperature,
            # vLLM extension: the generated token ids, including harmony's
            # channel/control tokens, which the draft must propose too.
            "return_token_ids": True,
        }
        async with sem:
            try:
                resp = await client.post(url, json=payload)
            except httpx.HTTPError as e:
                raise UserError(f"cannot reach {base_url} ({type(e).__name__}); is the service running? pass --url") from None
        if resp.status_code != 200:
            raise UserError(f"{url} answered HTTP {resp.status_code}: {resp.text[:200]}")
        for choice in resp.json().get("choices") or ():
            ids = choice.get("token_ids")
            if ids is None:
                raise UserError(f"{base_url} returned no token_ids; counting needs vLLM's return_token_ids "
                                "(serve with vLLM, or supply --counts FILE)")
            counts.update(ids)
        done += 1
        progress(f"counted {done}/{len(messages_list)} prompts, {sum(counts.values())} tokens")

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), headers=headers) as client:
        await asyncio.gather(*(one(client, m) for m in messages_list))
    return counts


def gather_counts(base_url: str, model: str, prompts, max_tokens: int, temperature: float = 0.0,
                  concurrency: int = 4, timeout: float = 600.0, progress=None,
                  headers: dict[str, str] | None = None) -> TokenCounts:
    """Run every prompt through the served target; count the token ids it generates. headers: sent with
    each request (the engine's API key, bench.target.auth_headers)."""
    messages_list = [[dict(m) for m in p.messages] for p in prompts]
    counts = asyncio.run(_gather(base_url, model, messages_list, max_tokens, temperature, concurrency, timeout,
                                 progress or (lambda text: None), headers or {}))
    if not counts:
        raise UserError(f"{base_url} generated no tokens for {len(prompts)} prompts; check the served model")
    return TokenCounts(counts=counts, vocab_size=None,
                       source=f"{base_url} model {model}: {len(prompts)} prompts x {max_tokens} max tokens")
