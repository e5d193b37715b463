"""HTTP probes of a running engine: /health, a one-token canary, and the /metrics counters we watch.

vLLM's /health is 503 only for a dead engine; a wedged one still answers 200
(vLLM#39863). Readiness therefore also needs a canary completion, and a running
engine is also judged by whether its token counter moves.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
GENERATED = "vllm:generation_tokens_total"


@dataclass(frozen=True)
class EngineMetrics:
    running: float
    waiting: float
    generated_tokens: float


class EngineProbe:
    def __init__(self, base_url: str, served_name: str, api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.served_name = served_name
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def health(self, timeout: float) -> bool:
        try:
            async with httpx.AsyncClient(timeout=timeout) as c:
                r = await c.get(f"{self.base_url}/health")
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    async def canary(self, timeout: float) -> str | None:
        """One-token completion. Returns None on success, else why it failed (one line)."""
        body = {"model": self.served_name, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
        try:
            async with httpx.AsyncClient(timeout=timeout) as c:
                r = await c.post(f"{self.base_url}/v1/completions", json=body, headers=self._headers)
        except httpx.TimeoutException:
            return f"canary completion timed out after {timeout:g} s"
        except httpx.HTTPError as e:
            return f"canary completion failed: {type(e).__name__}: {e}"
        if r.status_code != 200:
            return f"canary completion answered HTTP {r.status_code}: {r.text[:200]}"
        try:
            tokens = r.json()["usage"]["completion_tokens"]
        except (ValueError, KeyError, TypeError):
            return "canary completion answered without usage"
        return None if tokens >= 1 else "canary completion produced no token"

    async def metrics(self, timeout: float) -> EngineMetrics | None:
        try:
            async with httpx.AsyncClient(timeout=timeout) as c:
                r = await c.get(f"{self.base_url}/metrics")
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        values = parse_prometheus_sums(r.text, (RUNNING, WAITING, GENERATED))
        return EngineMetrics(values[RUNNING], values[WAITING], values[GENERATED])


def parse_prometheus_sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum each named series over its labels (vLLM labels by model and engine index)."""
    sums = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        name = line[:name_end]
        if name in sums:
            try:
                sums[name] += float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return sums
