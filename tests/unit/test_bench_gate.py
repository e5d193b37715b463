"""The correctness gate (bench/gate.py) on recorded outputs: the set, parsing answers, and the judge.

Recorded answers are built as the OpenAI bodies vLLM returns and go through parse_response, as the
recorder's do. The recorder against a real engine: tests/integration/test_bench_engine.py.
"""

from __future__ import annotations

import copy
import json

from gptoss_spark.bench import gate
from gptoss_spark.bench.gate import gate_items, judge, parse_response

ITEMS = {i.id: i for i in gate_items()}


def chat_body(content, reasoning="The user asks; answer briefly.", tool_calls=None, finish="stop") -> str:
    msg = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls is not None:
        msg["tool_calls"] = [{"id": "c1", "type": "function", "function": {"name": n, "arguments": a}}
                             for n, a in tool_calls]
    return json.dumps({"choices": [{"index": 0, "message": msg, "finish_reason": finish}]})


def completion_body(tokens: list[int], margins: list[float]) -> str:
    top = [{f"token_id:{t}": -0.1, f"token_id:{t + 1}": -0.1 - m} for t, m in zip(tokens, margins)]
    return json.dumps({"choices": [{"index": 0, "text": "x" * len(tokens), "finish_reason": "length",
                                    "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "top_logprobs": top}}]})


def good_record() -> dict:
    """Every item answered right: the tokens of each greedy prompt 100..131, all confident (margin 3 nats)."""
    items = {}
    for item_id, item in ITEMS.items():
        if item.part == "greedy":
            body = completion_body(list(range(100, 132)), [3.0] * 32)
        elif item.part == "exact":
            body = chat_body(item.expected)
        elif item.part == "tool":
            body = chat_body(None, tool_calls=[("get_weather", '{"city": "Lisbon"}')], finish="tool_calls")
        else:
            body = chat_body("No: 91 = 7 x 13.")
        items[item_id] = parse_response(item, 200, body)
    return {"kind": gate.RESULT_KIND_GATE, "set_version": gate.GATE_SET_VERSION, "items": items}


def with_answer(record: dict, item_id: str, body: str, status: int = 200) -> dict:
    rec = copy.deepcopy(record)
    rec["items"][item_id] = parse_response(ITEMS[item_id], status, body)
    return rec


def test_the_set_is_shipped_fixed_and_its_answers_are_right():
    items = gate_items()
    assert [i.id for i in items] == [i.id for i in gate_items()]  # the same questions every time
    parts = {p: [i for i in items if i.part == p] for p in ("greedy", "exact", "content", "tool", "reasoning")}
    assert len(parts["greedy"]) == 8 and len(parts["exact"]) == 24 and all(parts.values())
    arith = next(i for i in parts["exact"] if i.id == "exact-arith-00")
    a, op, b = arith.payload["messages"][0]["content"].split("?")[0].split()[-3:]
    assert str(eval(f"{a}{op}{b}")) == arith.expected  # noqa: S307 - the generated question, its answer
    assert all(i.payload["temperature"] == 0.0 for i in items)


def test_a_record_equal_to_the_reference_is_correct():
    v = judge(good_record(), good_record())
    assert v["verdict"] == "correct" and v["failures"] == []
    assert v["greedy"]["token_agreement"] == 1.0 and v["exact"]["candidate"] == 24


def test_null_content_on_chat_is_wrong():
    cand = with_answer(good_record(), "structure-content", chat_body(None, finish="length"))
    v = judge(good_record(), cand)
    assert v["verdict"] == "wrong"
    assert v["failures"] == [{"id": "structure-content", "check": "structure",
                              "why": "null content (finish_reason length: the answer ran out of tokens)"}]


def test_truncated_harmony_is_wrong():
    # The parser gave up: the raw channel text came through as content, no reasoning separated.
    raw = "<|channel|>analysis<|message|>The user asks about 91. 91 = 7*13<|end|><|start|>assistant<|channel|>fin"
    cand = with_answer(good_record(), "structure-reasoning", chat_body(raw, reasoning=None, finish="length"))
    v = judge(good_record(), cand)
    assert v["verdict"] == "wrong"
    assert v["failures"][0]["id"] == "structure-reasoning" and "harmony tokens in the text" in v["failures"][0]["why"]


def test_no_reasoning_or_reasoning_inside_the_content_is_wrong():
    none = with_answer(good_record(), "structure-reasoning", chat_body("No.", reasoning=""))
    mixed = with_answer(good_record(), "structure-reasoning", chat_body("Think: 91 = 7 x 13. No.", reasoning="91 = 7 x 13."))
    assert judge(good_record(), none)["failures"][0]["why"] == "no reasoning separated from the content"
    assert judge(good_record(), mixed)["failures"][0]["why"] == "the reasoning is repeated inside the content"


def test_tool_arguments_that_do_not_parse_are_wrong():
    cand = with_answer(good_record(), "structure-tool",
                       chat_body(None, tool_calls=[("get_weather", '{"city": "Lisb')], finish="tool_calls"))
    v = judge(good_record(), cand)
    assert v["verdict"] == "wrong"
    assert v["failures"][0]["why"].startswith("tool call get_weather: arguments do not parse as JSON")
    no_call = with_answer(good_record(), "structure-tool", chat_body("It is sunny."))
    assert judge(good_record(), no_call)["failures"][0]["why"] == "no tool call"


def test_an_http_error_is_wrong_and_names_the_prompt():
    cand = with_answer(good_record(), "exact-sort-0", '{"error": {"message": "EngineCore died"}}', status=500)
    v = judge(good_record(), cand)
    assert v["verdict"] == "wrong" and v["failures"][0] == {"id": "exact-sort-0", "check": "structure",
                                                           "why": "HTTP 500: EngineCore died"}


def diverge(record: dict, item_id: str, at: int, margin: float) -> dict:
    """The candidate's greedy tokens differ from position `at` on; the reference's margin there is `margin`."""
    ref = copy.deepcopy(record)
    tokens, margins = list(range(100, 132)), [3.0] * 32
    margins[at] = margin
    ref["items"][item_id] = parse_response(ITEMS[item_id], 200, completion_body(tokens, margins))
    cand_tokens = tokens[:at] + [t + 1000 for t in tokens[at:]]
    cand = with_answer(record, item_id, completion_body(cand_tokens, [margin] + [3.0] * 31 if at == 0 else
                                                       margins))
    return ref, cand


def test_a_one_token_divergence_at_a_near_tie_is_numerics_and_passes():
    ref, cand = diverge(good_record(), "greedy-capital", at=5, margin=0.05)
    v = judge(ref, cand)
    assert v["verdict"] == "correct" and v["greedy"]["confident_divergences"] == 0
    assert v["greedy"]["token_agreement"] == (7 * 32 + 5) / (8 * 32)


def test_one_confident_divergence_is_allowed_and_two_are_wrong():
    ref, cand = diverge(good_record(), "greedy-capital", at=5, margin=2.0)
    one = judge(ref, cand)
    assert one["verdict"] == "correct" and one["greedy"]["confident_divergences"] == 1
    ref2, cand2 = diverge(ref, "greedy-json", at=0, margin=2.0)
    cand2["items"]["greedy-capital"] = cand["items"]["greedy-capital"]
    two = judge(ref2, cand2)
    assert two["verdict"] == "wrong"
    assert {f["id"] for f in two["failures"]} == {"greedy-capital", "greedy-json"}
    assert "where the reference was confident (margin 2.00 nats >= 0.5)" in two["failures"][0]["why"]


def test_accuracy_may_fall_by_the_tolerance_and_no_more():
    cand = good_record()
    wrong_ids = [i for i in ITEMS if i.startswith("exact-arith")][: gate.ACCURACY_TOLERANCE_ITEMS + 1]
    for item_id in wrong_ids[:-1]:
        cand = with_answer(cand, item_id, chat_body("12"))
    within = judge(good_record(), cand)
    assert within["verdict"] == "correct" and within["exact"]["candidate"] == 22
    assert [f["id"] for f in within["failures"]] == wrong_ids[:-1]  # reported even when they pass
    beyond = judge(good_record(), with_answer(cand, wrong_ids[-1], chat_body("12")))
    assert beyond["verdict"] == "wrong"
    assert beyond["failures"][-1]["why"] == "21/24 exact answers right, the reference 24/24: 3 fewer, more than the 2 allowed"


def test_answers_in_a_usual_format_still_match():
    item = ITEMS["exact-sort-0"]
    cand = with_answer(good_record(), "exact-sort-0", chat_body(item.expected.replace(",", ", ") + "."))
    assert judge(good_record(), cand)["failures"] == []


def test_records_of_another_set_are_not_compared():
    other = good_record()
    other["set_version"] = gate.GATE_SET_VERSION + 1
    assert judge(good_record(), other)["verdict"] == "wrong"
