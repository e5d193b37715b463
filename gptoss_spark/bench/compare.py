"""`gptoss-spark bench compare A.json B.json`: the same metrics side by side, B/A ratio."""

from __future__ import annotations

from pathlib import Path

from ..base.errors import UserError
from ..base.fsutil import read_json
from .arena import RESULT_KIND_ARENA
from .load import RESULT_KIND_LOADTEST
from .single import RESULT_KIND_BENCH

# (label, path into the result, higher_is_better)
METRICS = {
    RESULT_KIND_BENCH: [
        ("decode tok/s (median)", ("summary", "decode_tok_s", "median"), True),
        ("decode tok/s (mean)", ("summary", "decode_tok_s", "mean"), True),
        ("decode tok/s (min)", ("summary", "decode_tok_s", "min"), True),
        ("TTFT s (median)", ("summary", "ttft_s", "median"), False),
        ("completion tokens (median)", ("summary", "completion_tokens", "median"), None),
        ("valid requests", ("summary", "valid_requests"), None),
        ("spec tokens per step", ("speculation", "tokens_per_step"), True),
    ],
    RESULT_KIND_LOADTEST: [
        ("aggregate tok/s", ("summary", "aggregate_tok_s"), True),
        ("TTFT s (p50)", ("summary", "ttft_s", "p50"), False),
        ("TTFT s (p90)", ("summary", "ttft_s", "p90"), False),
        ("per-user decode tok/s (median)", ("summary", "per_user_decode_tok_s", "median"), True),
        ("makespan s", ("summary", "makespan_s"), False),
        ("valid requests", ("summary", "valid_requests"), None),
        ("spec tokens per step", ("speculation", "tokens_per_step"), True),
    ],
    RESULT_KIND_ARENA: [
        ("decode tok/s (tg, depth 0, 1 stream)", ("summary", "decode_tok_s"), True),
        ("prefill tok/s (pp, depth 0, 1 stream)", ("summary", "prefill_tok_s"), True),
        ("e2e TTFT ms (depth 0, 1 stream)", ("summary", "e2e_ttft_ms"), False),
        ("valid figures", ("summary", "valid_figures"), None),
        ("spec tokens per step", ("speculation", "tokens_per_step"), True),
    ],
}
PROTOCOL_KEYS = ("endpoint", "max_tokens", "temperature", "reasoning_effort", "ignore_eos", "prompts",
                 "requests", "warmup", "users", "requests_per_user",
                 # bench arena
                 "llama_benchy", "pp", "tg", "runs", "points", "skip_coherence", "corpus")


def load_result(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = read_json(path)
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}; pass a file written by `bench --out` or `loadtest --out`") from None
    except ValueError:
        raise UserError(f"{path} is not JSON; pass a file written by `bench --out` or `loadtest --out`") from None
    if not isinstance(data, dict) or data.get("kind") not in METRICS:
        raise UserError(f"{path} is not a gptoss-spark bench or loadtest result (no known \"kind\"); "
                        "pass a file written by `bench --out` or `loadtest --out`")
    return data


def dig(obj: dict, path: tuple[str, ...]):
    """The value at path in a result, or None where the path ends early."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def compare(a: dict, b: dict) -> dict:
    if a["kind"] != b["kind"]:
        raise UserError(f"cannot compare a {a['kind']} result with a {b['kind']} result; compare two of the same kind")
    rows = []
    for label, path, higher_better in METRICS[a["kind"]]:
        va, vb = dig(a, path), dig(b, path)
        ratio = vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else None
        rows.append({"metric": label, "a": va, "b": vb, "ratio_b_over_a": ratio, "higher_is_better": higher_better})
    pa, pb = a.get("protocol", {}), b.get("protocol", {})
    differences = {k: {"a": pa.get(k), "b": pb.get(k)} for k in PROTOCOL_KEYS if pa.get(k) != pb.get(k)}
    return {
        "kind": a["kind"],
        "rows": rows,
        "protocol_differences": differences,
        "hosts": {side: _host_line(r) for side, r in (("a", a), ("b", b))},
    }


def _host_line(result: dict) -> dict:
    host = result.get("host") or {}
    return {
        "hostname": host.get("hostname"),
        "is_dgx_spark": host.get("is_dgx_spark"),
        "active_profile": (host.get("active_profile") or {}).get("active"),
        "started_at": result.get("started_at"),
    }
