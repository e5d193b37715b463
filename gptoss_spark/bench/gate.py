"""The correctness gate for `tune`: does a candidate engine configuration still answer like the reference?

Three parts, all shipped here (no external data, the same items on every box):
    greedy     fixed prompts on /v1/completions, temperature 0, with the top-2 logprobs of each token:
               the candidate's tokens are compared with the reference's one by one
    exact      generated arithmetic and formatting questions with one right answer, scored by exact match
    structure  harmony on chat: non-empty `content`, a tool call whose arguments parse as a JSON object,
               reasoning kept apart from the content

record_gate(target, ...) sends the set to an OpenAI endpoint and returns what came back (JSON-able);
judge(reference, candidate) is pure: "correct" or "wrong" with the failing prompts. The tolerances
and why they are what they are: docs/BENCHMARK.md, "The correctness gate".
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass

import httpx

from .request import ENDPOINTS, error_message
from .single import http_client
from .target import Target

RESULT_KIND_GATE = "gptoss-spark.gate-record"
GATE_SET_VERSION = 1  # bump when an item changes: records of different sets are not compared

# A greedy divergence is numerics, not a bug, where the reference's (or the candidate's) top two tokens were
# within this many nats of each other: rounding in another kernel can swap a near-tie. The texts after a
# divergence are different texts, so nothing past it is compared.
NEAR_TIE_NATS = 0.5
# Divergences at a confident token (margin >= NEAR_TIE_NATS) a correct candidate may still show, over all
# greedy prompts together.
CONFIDENT_DIVERGENCES_ALLOWED = 1
# Exact-match answers a correct candidate may get wrong beyond the reference's.
ACCURACY_TOLERANCE_ITEMS = 2

GREEDY_MAX_TOKENS = 32
EXACT_MAX_TOKENS = 512  # room for low-effort reasoning before the answer: a cut answer is a structure failure
STRUCTURE_MAX_TOKENS = 1024
HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>")

GREEDY_PROMPTS = (
    ("greedy-counting", "One, two, three, four, five, six,"),
    ("greedy-capital", "The capital of France is"),
    ("greedy-python", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("greedy-water", "Water boils at 100 degrees Celsius at sea level because"),
    ("greedy-alphabet", "A B C D E F G H"),
    ("greedy-json", '{"name": "Ada Lovelace", "born": 1815, "known_for": "'),
    ("greedy-german", "Der schnelle braune Fuchs springt"),
    ("greedy-list", "Three primary colours of light:\n1."),
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass(frozen=True)
class GateItem:
    id: str
    part: str  # greedy | exact | content | tool | reasoning
    payload: dict  # the request body without model
    expected: str | None = None

    @property
    def endpoint(self) -> str:
        return "completions" if self.part == "greedy" else "chat"


def _chat(text: str, max_tokens: int, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0.0,
            "reasoning_effort": "low", **extra}


def exact_items(seed: int = 46, n_arithmetic: int = 16) -> list[GateItem]:
    """Arithmetic with two- and three-digit numbers, and formatting tasks, each with one right answer.
    Generated from a fixed seed, so every box asks the same questions."""
    rng = random.Random(seed)
    items = []
    for i in range(n_arithmetic):
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        op = ("+", "-", "*")[i % 3]
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        items.append(GateItem(f"exact-arith-{i:02d}", "exact",
                              _chat(f"What is {a} {op} {b}? Reply with the number only.", EXACT_MAX_TOKENS),
                              str(answer)))
    words = ["harbour", "lantern", "meadow", "quartz", "thunder", "velvet", "willow", "zephyr"]
    for i, w in enumerate(words[:4]):
        items.append(GateItem(f"exact-upper-{i}", "exact",
                              _chat(f"Write the word {w} in capital letters. Reply with that word only.",
                                    EXACT_MAX_TOKENS), w.upper()))
    for i in range(4):
        nums = rng.sample(range(1, 50), 4)
        items.append(GateItem(f"exact-sort-{i}", "exact",
                              _chat(f"Sort these numbers ascending and reply with them separated by commas, "
                                    f"nothing else: {', '.join(map(str, nums))}", EXACT_MAX_TOKENS),
                              ",".join(map(str, sorted(nums)))))
    return items


def gate_items() -> list[GateItem]:
    greedy = [GateItem(pid, "greedy", {"prompt": text, "max_tokens": GREEDY_MAX_TOKENS, "temperature": 0.0,
                                       "logprobs": 2, "return_tokens_as_token_ids": True})
              for pid, text in GREEDY_PROMPTS]
    structure = [
        GateItem("structure-content", "content", _chat("Name one planet of the solar system.", STRUCTURE_MAX_TOKENS)),
        GateItem("structure-tool", "tool", _chat("What is the weather in Lisbon right now? Use the tool.",
                                                 STRUCTURE_MAX_TOKENS, tools=[WEATHER_TOOL], tool_choice="auto")),
        GateItem("structure-reasoning", "reasoning",
                 _chat("Is 91 a prime number? Think, then answer yes or no.", STRUCTURE_MAX_TOKENS)),
    ]
    return greedy + exact_items() + structure


# ---- recording ----------------------------------------------------------------------------------

def parse_response(item: GateItem, status: int, body: str) -> dict:
    """What the judge needs of one answer (pure, so recorded bodies can be replayed in tests)."""
    out: dict = {"part": item.part, "expected": item.expected, "error": None, "finish_reason": None,
                 "content": None, "reasoning": None, "tool_calls": [], "tokens": [], "top2_margins": []}
    if status >= 400:
        out["error"] = f"HTTP {status}: {error_message(body)}"
        return out
    try:
        choice = json.loads(body)["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        out["error"] = f"the answer is not an OpenAI response: {body[:120]!r}"
        return out
    out["finish_reason"] = choice.get("finish_reason")
    if item.endpoint == "completions":
        out["content"] = choice.get("text")
        lp = choice.get("logprobs") or {}
        out["tokens"] = list(lp.get("tokens") or [])
        out["top2_margins"] = [_margin(top) for top in lp.get("top_logprobs") or []]
        return out
    msg = choice.get("message") or {}
    out["content"] = msg.get("content")
    out["reasoning"] = msg.get("reasoning_content") or msg.get("reasoning")
    out["tool_calls"] = [{"name": (c.get("function") or {}).get("name"),
                          "arguments": (c.get("function") or {}).get("arguments")} for c in msg.get("tool_calls") or []]
    return out


def _margin(top: dict | None) -> float | None:
    """top-1 minus top-2 logprob at one position (None when fewer than two were returned)."""
    values = sorted((v for v in (top or {}).values() if isinstance(v, (int, float))), reverse=True)
    return values[0] - values[1] if len(values) >= 2 else None


async def _record(target: Target, items: list[GateItem], timeout: float) -> dict:
    answers = {}
    async with http_client(timeout, headers=target.headers) as client:
        for item in items:  # one at a time: batch composition must not change greedy numerics between runs
            url = target.base_url.rstrip("/") + ENDPOINTS[item.endpoint]
            try:
                resp = await client.post(url, json={"model": target.model, **item.payload})
                answers[item.id] = parse_response(item, resp.status_code, resp.text)
            except httpx.HTTPError as e:
                answers[item.id] = {**parse_response(item, 599, ""), "error": f"{type(e).__name__}: {e}"}
    return answers


def record_gate(target: Target, timeout: float = 300.0, items: list[GateItem] | None = None) -> dict:
    """Send the gate's set to the endpoint and return the record the judge reads."""
    items = items if items is not None else gate_items()
    return {"kind": RESULT_KIND_GATE, "set_version": GATE_SET_VERSION, "model": target.model,
            "base_url": target.base_url, "items": asyncio.run(_record(target, items, timeout))}


# ---- judging ------------------------------------------------------------------------------------

def _normalize(text: str | None) -> str:
    return (text or "").strip().strip("`").strip().rstrip(".").replace(", ", ",").strip()


def structure_problem(answer: dict) -> str | None:
    """Why one chat answer breaks harmony's structure (None when it does not). Applies to every chat item."""
    if answer["error"]:
        return answer["error"]
    content = answer["content"]
    leaked = [m for m in HARMONY_MARKERS if m in (content or "") or m in (answer["reasoning"] or "")]
    if leaked:
        return f"harmony tokens in the text ({', '.join(leaked)}): the answer was not parsed (truncated harmony?)"
    if answer["part"] == "tool":
        if not answer["tool_calls"]:
            return "no tool call"
        for call in answer["tool_calls"]:
            try:
                args = json.loads(call["arguments"] or "")
            except (TypeError, ValueError):
                return f"tool call {call['name']}: arguments do not parse as JSON: {str(call['arguments'])[:80]!r}"
            if not isinstance(args, dict):
                return f"tool call {call['name']}: arguments are not a JSON object"
        return None
    if content is None or not content.strip():
        why = "null" if content is None else "empty"
        cut = " (finish_reason length: the answer ran out of tokens)" if answer["finish_reason"] == "length" else ""
        return f"{why} content{cut}"
    if answer["part"] == "reasoning":
        if not (answer["reasoning"] or "").strip():
            return "no reasoning separated from the content"
        if answer["reasoning"].strip() in content:
            return "the reasoning is repeated inside the content"
    return None


def greedy_comparison(ref: dict, cand: dict) -> dict:
    """Token by token: where the candidate first differs and whether that position was a near-tie."""
    rt, ct = ref["tokens"], cand["tokens"]
    n = min(len(rt), len(ct))
    k = next((i for i in range(n) if rt[i] != ct[i]), None)
    if k is None and len(rt) != len(ct):
        k = n  # one stopped earlier: a divergence at the shorter one's end
    out = {"compared": n if k is None else k, "diverged_at": k, "near_tie": None, "margin": None}
    if k is None:
        return out
    margins = [m for side in (ref, cand) for m in [_at(side["top2_margins"], k)] if m is not None]
    out["margin"] = min(margins) if margins else None
    out["near_tie"] = out["margin"] is not None and out["margin"] < NEAR_TIE_NATS
    return out


def _at(values: list, i: int):
    return values[i] if i < len(values) else None


def judge(reference: dict, candidate: dict) -> dict:
    """The gate's verdict on a candidate's record against the reference's: {verdict, failures, ...}."""
    if reference.get("set_version") != candidate.get("set_version"):
        return {"verdict": "wrong", "failures": [{"id": "-", "check": "set",
                                                  "why": "recorded with a different gate set; record both again"}]}
    failures: list[dict] = []
    ref_items, cand_items = reference["items"], candidate["items"]
    correct = {"reference": 0, "candidate": 0}
    exact_total, confident, agreement = 0, [], []
    for item_id, ref in ref_items.items():
        cand = cand_items.get(item_id)
        if cand is None:
            failures.append({"id": item_id, "check": "missing", "why": "not in the candidate's record"})
            continue
        if ref["part"] == "greedy":
            if cand["error"]:
                failures.append({"id": item_id, "check": "greedy", "why": cand["error"]})
                continue
            cmp = greedy_comparison(ref, cand)
            agreement.append((cmp["compared"], max(len(ref["tokens"]), 1)))
            if cmp["diverged_at"] is not None and not cmp["near_tie"]:
                margin = "no logprobs" if cmp["margin"] is None else f"margin {cmp['margin']:.2f} nats"
                confident.append({"id": item_id, "check": "greedy",
                                  "why": f"differs from the reference at token {cmp['diverged_at']}, where the "
                                         f"reference was confident ({margin} >= {NEAR_TIE_NATS})"})
            continue
        problem = structure_problem(cand)
        if problem:
            failures.append({"id": item_id, "check": "structure", "why": problem})
        if ref["part"] == "exact":
            exact_total += 1
            correct["reference"] += _normalize(ref["content"]) == _normalize(ref["expected"])
            got = _normalize(cand["content"])
            if got == _normalize(cand["expected"]):
                correct["candidate"] += 1
            elif not problem:
                failures.append({"id": item_id, "check": "accuracy (counted, not failing alone)",
                                 "why": f"answered {got[:40]!r}, expected {cand['expected']!r}"})
    if len(confident) > CONFIDENT_DIVERGENCES_ALLOWED:
        failures += confident
    lost = correct["reference"] - correct["candidate"]
    structural = [f for f in failures if not f["check"].startswith("accuracy")]
    wrong = bool(structural) or lost > ACCURACY_TOLERANCE_ITEMS
    if lost > ACCURACY_TOLERANCE_ITEMS:
        failures.append({"id": "-", "check": "accuracy",
                         "why": f"{correct['candidate']}/{exact_total} exact answers right, the reference "
                                f"{correct['reference']}/{exact_total}: {lost} fewer, more than the "
                                f"{ACCURACY_TOLERANCE_ITEMS} allowed"})
    compared = sum(a for a, _ in agreement)
    return {
        "verdict": "wrong" if wrong else "correct",
        "failures": failures,
        "exact": {"total": exact_total, **correct, "tolerance_items": ACCURACY_TOLERANCE_ITEMS},
        "greedy": {"token_agreement": compared / sum(t for _, t in agreement) if agreement else None,
                   "confident_divergences": len(confident), "allowed": CONFIDENT_DIVERGENCES_ALLOWED,
                   "near_tie_nats": NEAR_TIE_NATS},
    }
