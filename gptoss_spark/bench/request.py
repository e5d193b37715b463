"""One streamed request: payload, SSE reading, timing, and why a run is invalid.

Timing rules of the seed protocol (docs/HARDWARE.md, the seed):
- first output = the first chunk carrying generated text (content, reasoning or
  tool-call text). vLLM's chat stream opens with a role-only chunk that is sent
  before any token exists; it must not count, or TTFT would read ~0.
- decode rate = (completion_tokens - 1) / (last output - first output): the
  first token's time belongs to prefill (TTFT), the rest to decode.
- token counts only from the server's final `usage`, never from counting
  chunks (a chunk may carry several tokens, e.g. with speculative decoding).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import httpx

from .prompts import Prompt

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class RequestSpec:
    """Sampling settings shared by every request of a run."""

    endpoint: str = "chat"
    model: str = "gptoss"
    max_tokens: int = 512
    temperature: float = 0.0
    reasoning_effort: str | None = "low"
    ignore_eos: bool = False


def build_payload(spec: RequestSpec, prompt: Prompt, max_tokens: int | None = None) -> dict:
    payload: dict = {
        "model": spec.model,
        "max_tokens": max_tokens if max_tokens is not None else spec.max_tokens,
        "temperature": spec.temperature,
        "stream": True,
        # The only source of token counts: the final chunk's usage.
        "stream_options": {"include_usage": True},
    }
    if spec.endpoint == "chat":
        payload["messages"] = [dict(m) for m in prompt.messages]
        if spec.reasoning_effort:
            payload["reasoning_effort"] = spec.reasoning_effort
    else:
        payload["prompt"] = prompt.completion_text()
    if spec.ignore_eos:
        payload["ignore_eos"] = True  # vLLM extension: exact lengths for raw decode
    return payload


@dataclass
class RequestRecord:
    """What one request did. Times are seconds since the run's t0 (perf_counter)."""

    index: int
    prompt_id: str
    user: int | None = None
    warmup: bool = False
    sent_at: float | None = None
    first_output_at: float | None = None
    last_output_at: float | None = None
    ended_at: float | None = None
    output_chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    http_status: int | None = None
    error: str | None = None  # the request itself failed (HTTP error, cut stream, unreachable)
    saw_done: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        if self.sent_at is None or self.first_output_at is None:
            return None
        return self.first_output_at - self.sent_at

    @property
    def decode_window_s(self) -> float | None:
        if self.first_output_at is None or self.last_output_at is None:
            return None
        return self.last_output_at - self.first_output_at

    @property
    def decode_tok_s(self) -> float | None:
        if self.invalid_reason is not None:
            return None
        return (self.completion_tokens - 1) / self.decode_window_s

    @property
    def invalid_reason(self) -> str | None:
        """None when the timing is usable; otherwise why not, in words."""
        if self.error:
            return self.error
        if self.completion_tokens is None:
            return "server sent no usage in the stream; token counts come only from usage (vLLM sends it with stream_options.include_usage)"
        if self.completion_tokens < 2:
            return f"only {self.completion_tokens} completion token(s); a decode rate needs at least 2"
        if self.first_output_at is None:
            return "no output text arrived before the stream ended"
        if self.output_chunks < 2 or not self.decode_window_s or self.decode_window_s <= 0:
            return (
                f"all {self.completion_tokens} tokens arrived in one chunk, so per-token timing is impossible "
                "(random-weight models do this on chat; use --endpoint completions)"
            )
        return None

    @property
    def valid(self) -> bool:
        return self.invalid_reason is None

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(
            valid=self.valid,
            invalid_reason=self.invalid_reason,
            ttft_s=self.ttft_s,
            decode_tok_s=self.decode_tok_s,
        )
        return d


class StreamReader:
    """Feeds SSE lines with their arrival time into a RequestRecord."""

    def __init__(self, record: RequestRecord):
        self.record = record

    def feed(self, line: str, at: float) -> None:
        if not line.startswith("data:"):
            return  # blank separators, comments, event: lines
        data = line[5:].strip()
        if data == "[DONE]":
            self.record.saw_done = True
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            self.record.error = f"server sent a chunk that is not JSON: {data[:80]!r}"
            return
        if not isinstance(chunk, dict):
            return
        error = chunk.get("error") or (chunk if chunk.get("object") == "error" else None)
        if error:
            msg = error.get("message", error) if isinstance(error, dict) else error
            self.record.error = f"server reported an error mid-stream: {str(msg)[:200]}"
            return
        if _chunk_has_output(chunk):
            if self.record.first_output_at is None:
                self.record.first_output_at = at
            self.record.last_output_at = at
            self.record.output_chunks += 1
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason"):
                self.record.finish_reason = choice["finish_reason"]
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            self.record.completion_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                self.record.prompt_tokens = int(usage["prompt_tokens"])

    def finish(self, max_tokens: int) -> None:
        """Called when the body ended cleanly; flags streams that ended early."""
        rec = self.record
        if rec.error is None and not rec.saw_done:
            rec.error = f"stream ended after {rec.output_chunks} output chunk(s) without [DONE]: the server cut it"
        if rec.error is None and rec.finish_reason and rec.finish_reason != "length":
            rec.warnings.append(
                f"finished early (finish_reason={rec.finish_reason}) at {rec.completion_tokens} of {max_tokens} tokens"
            )


def _chunk_has_output(chunk: dict) -> bool:
    for choice in chunk.get("choices") or ():
        if choice.get("text"):
            return True
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls"):
            return True
    return False


async def send_streamed(
    client: httpx.AsyncClient,
    base_url: str,
    spec: RequestSpec,
    prompt: Prompt,
    record: RequestRecord,
    t0: float,
    max_tokens: int | None = None,
) -> RequestRecord:
    """Send one streamed request and fill `record`. Never raises for server faults."""
    url = base_url.rstrip("/") + ENDPOINTS[spec.endpoint]
    payload = build_payload(spec, prompt, max_tokens)
    reader = StreamReader(record)
    now = lambda: time.perf_counter() - t0  # noqa: E731
    record.sent_at = now()
    try:
        async with client.stream("POST", url, json=payload) as resp:
            record.http_status = resp.status_code
            if resp.status_code >= 400:
                body = (await resp.aread()).decode("utf-8", "replace")
                record.error = f"HTTP {resp.status_code}: {error_message(body)}"
            else:
                async for line in resp.aiter_lines():
                    reader.feed(line, now())
                    if record.error:
                        break
                reader.finish(payload["max_tokens"])
    except httpx.ConnectError as e:
        record.error = f"cannot connect to {base_url}: {e or 'connection refused'}"
    except httpx.TimeoutException as e:
        record.error = f"timed out waiting for the server ({type(e).__name__}); raise --timeout if the engine is slow"
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        record.error = f"stream cut after {record.output_chunks} output chunk(s): {e}"
    except httpx.HTTPError as e:
        record.error = f"HTTP transport error: {type(e).__name__}: {e}"
    record.ended_at = now()
    return record


def error_message(body: str) -> str:
    """The server's message out of an error body (OpenAI's {"error": {"message"}} or plain text), cut to 200."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return body.strip()[:200] or "(empty body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err)[:200]
        if isinstance(obj.get("message"), str):
            return obj["message"][:200]
        return str(err)[:200]
    return str(obj)[:200]
