"""The streamed-request reader: timing points, usage-only counts, and every invalid-run reason."""

import json

from gptoss_spark.bench.prompts import Prompt
from gptoss_spark.bench.request import RequestRecord, RequestSpec, StreamReader, build_payload

PROMPT = Prompt(id="p", messages=({"role": "user", "content": "hi"},))


def chat_chunk(content=None, reasoning=None, role=None, finish=None):
    delta = {}
    if role:
        delta["role"] = role
        delta["content"] = ""
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def usage_chunk(completion, prompt=7):
    return "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}})


def feed(lines_at, max_tokens=512):
    rec = RequestRecord(index=0, prompt_id="p", sent_at=0.0)
    reader = StreamReader(rec)
    for line, at in lines_at:
        reader.feed(line, at)
    reader.finish(max_tokens)
    return rec


def test_role_only_opening_chunk_is_not_the_first_output():
    rec = feed([
        (chat_chunk(role="assistant"), 0.01),  # vLLM sends this before any token exists
        (chat_chunk(reasoning="Th"), 0.50),
        (chat_chunk(content="Hello"), 0.60),
        (chat_chunk(content=" world", finish="length"), 1.50),
        (usage_chunk(11), 1.50),
        ("data: [DONE]", 1.51),
    ])
    assert rec.first_output_at == 0.50
    assert rec.ttft_s == 0.50
    assert rec.last_output_at == 1.50
    assert rec.valid, rec.invalid_reason


def test_decode_rate_uses_usage_tokens_not_chunk_count():
    # 3 chunks carrying 21 tokens (as with speculative decoding): only usage counts.
    rec = feed([
        (chat_chunk(content="a"), 1.0),
        (chat_chunk(content="bbbbbbbbbb"), 1.5),
        (chat_chunk(content="cccccccccc", finish="length"), 3.0),
        (usage_chunk(21), 3.0),
        ("data: [DONE]", 3.0),
    ], max_tokens=21)
    assert rec.completion_tokens == 21
    assert rec.output_chunks == 3
    assert rec.decode_tok_s == (21 - 1) / (3.0 - 1.0)
    assert rec.warnings == []


def test_completions_text_chunks_count_as_output():
    line = "data: " + json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": None}]})
    rec = feed([(line, 0.2), (line, 0.3), (usage_chunk(2), 0.3), ("data: [DONE]", 0.3)])
    assert rec.valid and rec.first_output_at == 0.2 and rec.decode_tok_s == 1 / (0.3 - 0.2)


def test_missing_usage_is_invalid_with_reason():
    rec = feed([(chat_chunk(content="a"), 0.1), (chat_chunk(content="b"), 0.2), ("data: [DONE]", 0.2)])
    assert not rec.valid
    assert "usage" in rec.invalid_reason
    assert rec.decode_tok_s is None


def test_whole_answer_in_one_chunk_is_invalid():
    rec = feed([(chat_chunk(content="everything at once", finish="stop"), 2.0), (usage_chunk(40), 2.0),
                ("data: [DONE]", 2.0)])
    assert not rec.valid
    assert "one chunk" in rec.invalid_reason


def test_stream_without_done_is_a_cut():
    rec = feed([(chat_chunk(content="a"), 0.1), (chat_chunk(content="b"), 0.2)])
    assert not rec.valid
    assert "without [DONE]" in rec.invalid_reason


def test_error_event_mid_stream_is_reported():
    err = "data: " + json.dumps({"error": {"message": "engine dead", "code": 500}})
    rec = feed([(chat_chunk(content="a"), 0.1), (err, 0.2)])
    assert not rec.valid
    assert "engine dead" in rec.invalid_reason


def test_early_stop_is_valid_but_warned():
    rec = feed([(chat_chunk(content="a"), 0.1), (chat_chunk(content="b", finish="stop"), 0.2),
                (usage_chunk(5), 0.2), ("data: [DONE]", 0.2)], max_tokens=512)
    assert rec.valid
    assert rec.warnings and "finish_reason=stop" in rec.warnings[0]


def test_too_few_tokens_is_invalid():
    rec = feed([(chat_chunk(content="a"), 0.1), (chat_chunk(content="", finish="stop"), 0.2),
                (usage_chunk(1), 0.2), ("data: [DONE]", 0.2)])
    assert not rec.valid and "at least 2" in rec.invalid_reason


def test_payload_chat_carries_protocol_fields():
    spec = RequestSpec(endpoint="chat", model="gptoss", max_tokens=512, reasoning_effort="low")
    p = build_payload(spec, PROMPT)
    assert p["stream"] is True and p["stream_options"] == {"include_usage": True}
    assert p["temperature"] == 0.0 and p["reasoning_effort"] == "low" and p["max_tokens"] == 512
    assert p["messages"] == [{"role": "user", "content": "hi"}] and "prompt" not in p
    assert "ignore_eos" not in p


def test_payload_completions_uses_text_and_no_reasoning_effort():
    spec = RequestSpec(endpoint="completions", model="m", max_tokens=8, ignore_eos=True)
    p = build_payload(spec, PROMPT, max_tokens=4)
    assert p["prompt"] == "hi" and "messages" not in p and "reasoning_effort" not in p
    assert p["ignore_eos"] is True and p["max_tokens"] == 4


def test_the_connect_timeout_is_the_users_timeout_the_error_names():
    """A load test against an engine busy on one core: a late accept is bounded by --timeout (which the
    timeout error tells the user to raise), not by a fixed 10 s."""
    import asyncio

    from gptoss_spark.bench.single import http_client

    async def timeouts():
        async with http_client(42.0) as client:
            return client.timeout
    t = asyncio.run(timeouts())
    assert (t.connect, t.read) == (42.0, 42.0)
