"""`gptoss-spark bench arena`: the Spark Arena leaderboard's benchmark, what it measures and what counts.

The leaderboard is filled by `sparkrun arena benchmark`, which runs llama-benchy
with the profile `@official/spark-arena-v2` (docs/BENCHMARK.md, "Spark Arena
(llama-benchy)", says where each setting comes from). This module holds those
settings, the leaderboard's own gpt-oss-120b figures (theirs, never ours), and
turns llama-benchy's JSON, one file per point, into a result shaped like the
seed protocol's (kind, target, protocol, summary, invalid, host), with every
figure marked valid or not and why.
"""

from __future__ import annotations

from datetime import datetime

from .single import result_header
from .target import Target

RESULT_KIND_ARENA = "gptoss-spark.bench-arena"

# spark-arena/recipe-registry benchmarking/spark-arena-v2.yaml (v1 has the same arguments).
PROFILE_NAME = "spark-arena-v2"
DEPTHS = (0, 4096, 8192, 16384, 32768, 65535, 100000)
CONCURRENCY = (1, 2, 5, 10)
PP = 2048
TG = 128
RUNS = 3
# The profile's heat-aware order of its 28 (depth, concurrency) points; sparkrun runs
# one llama-benchy process per point, in this order.
SCHEDULE = (
    (8192, 5), (4096, 5), (8192, 10), (8192, 2), (4096, 2), (100000, 5), (100000, 2), (65535, 10),
    (65535, 1), (0, 1), (65535, 5), (32768, 2), (4096, 10), (16384, 1), (8192, 1), (32768, 5),
    (0, 10), (16384, 10), (32768, 1), (0, 5), (16384, 5), (100000, 1), (32768, 10), (16384, 2),
    (0, 2), (65535, 2), (4096, 1), (100000, 10),
)
HEADLINE_POINT = (0, 1)  # depth 0, one stream: where the leaderboard's tg128 figure comes from

# Spark Arena's leaderboard, gpt-oss-120b on vLLM, MXFP4, tg128 (docs/BENCHMARK.md cites where).
ARENA_LABEL = "the Spark Arena leaderboard's figures, theirs, not measured here"
ARENA_WHAT = f"gpt-oss-120b on vLLM, MXFP4, llama-benchy tg{TG} at depth 0, one stream"
ARENA_DECODE_TOK_S = {"single Spark": 58.82, "two Sparks, TP=2": 75.96}


def schedule(depths: list[int] | None, concurrency: list[int] | None) -> list[tuple[int, int]]:
    """The points to run: the profile's own order, or depth-major over what the user named."""
    if depths is None and concurrency is None:
        return list(SCHEDULE)
    return [(d, c) for d in (depths or DEPTHS) for c in (concurrency or CONCURRENCY)]


def fits(depth: int, pp: int, tg: int, max_model_len: int | None) -> bool:
    return max_model_len is None or depth + pp + tg <= max_model_len


def _metric(m: dict | None) -> dict | None:
    return None if not m else {"mean": m["mean"], "std": m["std"], "values": list(m["values"])}


def figures(raw: dict, runs: int) -> list[dict]:
    """llama-benchy's runs of one point as figures (llama-benchy's test names), each judged valid or not.

    A prefill figure needs a value from every run. A decode figure needs one too; llama-benchy leaves
    decode blank when no token came after the first chunk's timestamp (the whole response in one
    chunk), and its peak figure is then the chunk's tokens per 1 s window, so it is invalid with it.
    """
    out = []
    for b in raw.get("benchmarks") or []:
        ctx = b.get("is_context_prefill_phase", False)
        d, c = b.get("context_size", 0), b.get("concurrency", 1)
        at = f" @ d{d}" if d else ""
        names = (f"ctx_pp @ d{d}", f"ctx_tg @ d{d}") if ctx else (f"pp{b.get('prompt_size')}{at}", f"tg{b.get('response_size')}{at}")
        pp, tg = _metric(b.get("pp_throughput")), _metric(b.get("tg_throughput"))
        pp_bad = _missing(pp, runs, "prefill")
        out.append({"test": names[0], "kind": "prefill", "depth": d, "concurrency": c,
                    "tok_s": pp, "tok_s_per_request": _metric(b.get("pp_req_throughput")),
                    "ttfr_ms": _metric(b.get("ttfr")), "est_ppt_ms": _metric(b.get("est_ppt")),
                    "e2e_ttft_ms": _metric(b.get("e2e_ttft")), "valid": pp_bad is None, "invalid_reason": pp_bad})
        tg_bad = _missing(tg, runs, "decode")
        if tg is None:
            tg_bad = ("no decode interval: each response came as one chunk (llama-benchy's t/s is blank, "
                      "its peak t/s is then that chunk's tokens per 1 s)")
        out.append({"test": names[1], "kind": "decode", "depth": d, "concurrency": c,
                    "tok_s": tg, "tok_s_per_request": _metric(b.get("tg_req_throughput")),
                    "peak_tok_s": _metric(b.get("peak_throughput")), "valid": tg_bad is None,
                    "invalid_reason": tg_bad})
    return out


def _missing(m: dict | None, runs: int, what: str) -> str | None:
    if m is None:
        return f"llama-benchy gave no {what} figure"
    if len(m["values"]) < runs:
        return f"only {len(m['values'])} of {runs} runs gave a {what} figure"
    return None


def _headline(points: list[dict]) -> dict:
    point = next((p for p in points if (p["depth"], p["concurrency"]) == HEADLINE_POINT), None)
    figs = point["figures"] if point else []
    dec = next((f for f in figs if f["kind"] == "decode" and f["test"].startswith("tg")), None)
    pre = next((f for f in figs if f["kind"] == "prefill" and f["test"].startswith("pp")), None)

    def mean(f: dict | None, key: str = "tok_s"):
        return f[key]["mean"] if f and f["valid"] and f.get(key) else None

    return {"decode_tok_s": mean(dec), "decode_valid": bool(dec and dec["valid"]),
            "decode_invalid_reason": (dec or {}).get("invalid_reason") or (None if dec else "not measured"),
            "prefill_tok_s": mean(pre), "e2e_ttft_ms": mean(pre, "e2e_ttft_ms"),
            "prefill_valid": bool(pre and pre["valid"]),
            "prefill_invalid_reason": (pre or {}).get("invalid_reason") or (None if pre else "not measured")}


def arena_result(target: Target, protocol: dict, points: list[dict], host: dict, started_at: datetime) -> dict:
    figs = [f for p in points for f in p["figures"]]
    # A failed point's figures carry its error; a point without figures is listed once on its own.
    invalid = [{"depth": p["depth"], "concurrency": p["concurrency"], "test": None, "reason": p["error"]}
               for p in points if p["error"] and not p["figures"]]
    invalid += [{"depth": f["depth"], "concurrency": f["concurrency"], "test": f["test"], "reason": f["invalid_reason"]}
                for f in figs if not f["valid"]]
    return {
        **result_header(RESULT_KIND_ARENA, target, started_at),
        "protocol": protocol,
        "summary": {
            **_headline(points),
            "points": len(points),
            "points_run": sum(p["ran"] for p in points),
            "points_failed": sum(bool(p["error"]) for p in points),
            "figures": len(figs),
            "valid_figures": sum(f["valid"] for f in figs),
            "invalid_figures": sum(not f["valid"] for f in figs),
        },
        "invalid": invalid,
        "points": points,
        "reference": {"label": ARENA_LABEL, "what": ARENA_WHAT, "decode_tok_s": dict(ARENA_DECODE_TOK_S), "test": f"tg{TG}",
                      "depth": HEADLINE_POINT[0], "concurrency": HEADLINE_POINT[1]},
        "host": host,
    }


def same_as_arena(protocol: dict) -> list[str]:
    """How this run's settings differ from the leaderboard's (empty: the same)."""
    diff = []
    if protocol["pp"] != PP or protocol["tg"] != TG:
        diff.append(f"pp{protocol['pp']}/tg{protocol['tg']} instead of pp{PP}/tg{TG}")
    if protocol["runs"] != RUNS:
        diff.append(f"{protocol['runs']} run(s) per point instead of {RUNS}")
    if [tuple(p) for p in protocol["points"]] != list(SCHEDULE):
        diff.append(f"{len(protocol['points'])} of the profile's {len(SCHEDULE)} (depth, concurrency) points, "
                    "or another order")
    if protocol["skip_coherence"]:
        diff.append("coherence test skipped")
    return diff
