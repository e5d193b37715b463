"""Human output: the TTY progress line and the result tables."""

from __future__ import annotations

import sys
from typing import TextIO

from .arena import ARENA_DECODE_TOK_S, ARENA_LABEL, ARENA_WHAT
from .seed import SEED_LABEL, SEED_LOADTEST, SEED_PROTOCOL, SEED_SINGLE_STREAM_TOK_S
from .speculation import render as render_speculation


class Progress:
    """One self-overwriting status line on stderr, only when stderr is a terminal."""

    def __init__(self, stream: TextIO | None = None, enabled: bool | None = None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._shown = False

    def __call__(self, text: str) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K" + text)
            self.stream.flush()
            self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False


def _f(value, fmt: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, fmt)


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(headers)] + [line(r) for r in rows]


def _where(result: dict, title: str) -> list[str]:
    """What was measured, on which host: the first lines of every result table."""
    t, h = result["target"], result["host"]
    gpus = (h.get("gpu") or {}).get("gpus")
    gpu = ", ".join(g["name"] for g in gpus) if gpus else "none"
    prof = h.get("active_profile") or {}
    profile = prof.get("active") or f"unknown ({prof.get('reason', 'admin API did not answer')})"
    where = "DGX Spark" if h.get("is_dgx_spark") else "NOT a DGX Spark"
    return [
        f"{title}  {t['base_url']}  model {t['model']}" + (f"  (server vLLM {t['server_version']})" if t.get("server_version") else ""),
        f"host {h.get('hostname')} ({h.get('machine')}), GPU: {gpu}, profile: {profile}  [{where}]",
        f"vLLM patches: {(h.get('patch_manifest') or {}).get('state') or 'unknown'}",
    ]


def _header(result: dict, title: str) -> list[str]:
    p = result["protocol"]
    proto = f"{p['endpoint']}, max_tokens {p['max_tokens']}, temperature {p['temperature']:g}"
    if p.get("reasoning_effort"):
        proto += f", reasoning_effort {p['reasoning_effort']}"
    if p.get("ignore_eos"):
        proto += ", ignore_eos"
    return [*_where(result, title), f"protocol: {proto}, {p['warmup']} warm-up", ""]


def render_bench(result: dict) -> str:
    s = result["summary"]
    lines = _header(result, "gptoss-spark bench")
    rows = []
    for r in result["requests"]:
        note = "; ".join(r["warnings"]) if r["valid"] else "INVALID: " + r["invalid_reason"]
        rows.append([str(r["index"] + 1), r["prompt_id"], _f(r["completion_tokens"], "d"), _f(r["ttft_s"], ".3f"),
                     _f(r["decode_tok_s"]), note])
    lines += _table(["#", "prompt", "tokens", "TTFT s", "decode tok/s", "note"], rows, right={0, 2, 3, 4})
    d, t = s["decode_tok_s"], s["ttft_s"]
    lines += [
        "",
        f"decode tok/s  median {_f(d['median'])}  mean {_f(d['mean'])}  min {_f(d['min'])}  max {_f(d['max'])}"
        f"   ({s['valid_requests']}/{s['requests']} valid)",
        f"TTFT s        median {_f(t['median'], '.3f')}  min {_f(t['min'], '.3f')}  max {_f(t['max'], '.3f')}",
    ]
    lines += render_speculation(result.get("speculation"))
    lines += _reference_single(result)
    return "\n".join(lines) + "\n"


def _reference_single(result: dict) -> list[str]:
    profile = (result["host"].get("active_profile") or {}).get("active")
    shown = {profile: SEED_SINGLE_STREAM_TOK_S[profile]} if profile in SEED_SINGLE_STREAM_TOK_S else SEED_SINGLE_STREAM_TOK_S
    lines = ["", "reference (" + SEED_LABEL + "; chat, 4 x 512 tokens, reasoning_effort low):"]
    lines += [f"  {name} profile: {value} tok/s single stream" for name, value in shown.items()]
    if not result["host"].get("is_dgx_spark"):
        lines.append("  this host is not a DGX Spark: its numbers are not comparable with the seed's")
    p = result["protocol"]
    if (p["endpoint"], p["max_tokens"], p.get("reasoning_effort"), p["ignore_eos"]) != SEED_PROTOCOL:
        lines.append("  this run's protocol differs from the seed's (chat, 512 tokens, reasoning_effort low)")
    return lines


def render_loadtest(result: dict) -> str:
    s, p = result["summary"], result["protocol"]
    lines = _header(result, "gptoss-spark loadtest")
    lines.append(f"{p['users']} users x {p['requests_per_user']} request(s) each, all started together")
    lines.append("")
    ttft, pu = s["ttft_s"], s["per_user_decode_tok_s"]
    rows = [
        ["aggregate tok/s", _f(s["aggregate_tok_s"]), f"{s['completion_tokens_total']} tokens / {s['makespan_s']:.2f} s makespan"],
        ["TTFT s p50", _f(ttft["p50"], ".3f"), ""],
        ["TTFT s p90", _f(ttft["p90"], ".3f"), f"max {_f(ttft['max'], '.3f')}"],
        ["per-user decode tok/s", _f(pu["median"]), f"median; min {_f(pu['min'])}, max {_f(pu['max'])}"],
        ["requests valid", f"{s['valid_requests']}/{s['requests']}", f"decoding at once (observed): {s['observed_concurrency']}"],
    ]
    lines += _table(["metric", "value", ""], rows, right={1})
    if result["invalid"]:
        lines += ["", "invalid requests:"]
        lines += [f"  #{i['index'] + 1} (user {i['user']}): {i['reason']}" for i in result["invalid"]]
    lines += render_speculation(result.get("speculation"))
    ref = SEED_LOADTEST["plain"]
    lines += ["", f"reference ({SEED_LABEL}): plain profile, {ref['users']} users: "
                  f"{ref['aggregate_tok_s']} tok/s aggregate, TTFT median {ref['ttft_p50_s']} s"]
    if not result["host"].get("is_dgx_spark"):
        lines.append("  this host is not a DGX Spark: its numbers are not comparable with the seed's")
    return "\n".join(lines) + "\n"


def render_compare(cmp: dict, name_a: str, name_b: str) -> str:
    lines = [f"A: {name_a}  ({_host(cmp['hosts']['a'])})", f"B: {name_b}  ({_host(cmp['hosts']['b'])})", ""]
    rows = []
    for r in cmp["rows"]:
        fmt = ".3f" if "TTFT" in r["metric"] or "makespan" in r["metric"] else ".1f"
        ratio = _f(r["ratio_b_over_a"], ".3f")
        if r["ratio_b_over_a"] is not None and r["higher_is_better"] is not None and r["ratio_b_over_a"] != 1:
            better = (r["ratio_b_over_a"] > 1) == r["higher_is_better"]
            ratio += "  (B better)" if better else "  (B worse)"
        rows.append([r["metric"], _fmt_num(r["a"], fmt), _fmt_num(r["b"], fmt), ratio])
    lines += _table(["metric", "A", "B", "B/A"], rows, right={1, 2})
    if cmp["protocol_differences"]:
        lines += ["", "protocol differs (ratios compare unlike runs):"]
        lines += [f"  {k}: A={v['a']!r} B={v['b']!r}" for k, v in cmp["protocol_differences"].items()]
    return "\n".join(lines) + "\n"


def _fmt_num(v, fmt: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "-" if v is None else str(v)
    return str(v) if isinstance(v, int) else format(v, fmt)


def _host(h: dict) -> str:
    spark = "DGX Spark" if h.get("is_dgx_spark") else "not a Spark"
    return f"{h.get('hostname')}, {spark}, profile {h.get('active_profile') or 'unknown'}, {h.get('started_at')}"


def render_ab(result: dict) -> str:
    """`bench ab`: every profile's headline numbers side by side, ratios to the baseline, one recommendation."""
    names, base, runs = result["profiles"], result["baseline"], result["runs"]
    s = result["settings"]
    first = next((runs[n][k] for n in result["measuring_order"] for k in ("single", "load") if runs[n][k]), None)
    lines = [f"gptoss-spark bench ab  {s['url']}  baseline {base}, measured in order {', '.join(result['measuring_order'])}",
             f"single stream: {s['warmup']} warm-up + {s['requests']} requests; {s['users']} users x "
             f"{s['requests_per_user']} request(s); {s['endpoint']}, max_tokens {s['max_tokens']}"]
    if first:
        h = first["host"]
        where = "DGX Spark" if h.get("is_dgx_spark") else "NOT a DGX Spark: these numbers say nothing about a Spark"
        lines.append(f"host {h.get('hostname')} ({h.get('machine')})  [{where}]")
    lines.append("")
    others = names[1:]
    headers = ["metric", *names, *(f"{n}/{base}" for n in others)]
    rows = []
    for r in result["comparison"]:
        fmt = ".3f" if "TTFT" in r["metric"] or "makespan" in r["metric"] else ".1f"
        prefix = "single: " if r["run"] == "single" else f"{s['users']} users: "
        rows.append([prefix + r["metric"], *(_fmt_num(r["values"][n], fmt) for n in names),
                     *(_f(r["ratio_to_baseline"][n], ".2f") + ("x" if r["ratio_to_baseline"][n] is not None else "")
                       for n in others)])
    rows.append(["switch", *(_switch_cell(runs[n]["switch"]) for n in names), *("" for _ in others)])
    lines += _table(headers, rows, right=set(range(1, len(headers))))
    problems = []
    for n in names:
        run = runs[n]
        sw = run["switch"]
        if sw is None:
            problems.append(f"{n}: not reached (interrupted)")
        elif not sw["ok"]:
            rolled = f" (rolled back to {sw['rolled_back_to']})" if sw.get("rolled_back_to") else ""
            problems.append(f"{n}: switch FAILED{rolled}: {sw['error']}")
        elif run["error"]:
            problems.append(f"{n}: {run['error']}")
        for kind in ("single", "load"):
            for bad in (run[kind] or {}).get("invalid", []):
                problems.append(f"{n}: {kind} request #{bad['index'] + 1} invalid: {bad['reason']}")
        repeat = run.get("repeat")
        if repeat and repeat["switch"] and not repeat["switch"]["ok"]:
            problems.append(f"{n}: second run: switch FAILED: {repeat['switch']['error']}")
        elif repeat and repeat["error"]:
            problems.append(f"{n}: second run: {repeat['error']}")
        for kind in ("single", "load"):
            for bad in ((repeat or {}).get(kind) or {}).get("invalid", []):
                problems.append(f"{n}: second run: {kind} request #{bad['index'] + 1} invalid: {bad['reason']}")
    if problems:
        lines += ["", *problems]
    lines += _noise_lines(base, result["recommendation"].get("noise"), s["users"])
    restored = result["restored"]
    lines.append("")
    if restored["ok"]:
        lines.append(f"service back on {restored['profile']}" + ("" if restored["noop"] else
                                                                  f" (switched back in {restored['seconds']:.0f} s)"))
    else:
        lines.append(f"NOT switched back to {restored['profile']}: {restored['error']}; "
                     f"run `sudo gptoss-spark profile {restored['profile']}`")
    if result["interrupted"]:
        lines.append("interrupted: the profiles not reached were not measured")
    lines.append(f"recommendation: {result['recommendation']['text']}")
    if result.get("recommendation_by_load") is not None:
        from .sweep import render_ranges

        lines += ["recommendation by load (highest aggregate tok/s at each swept concurrency):",
                  *render_ranges(result["recommendation_by_load"])]
        lines.append(f"sweep curves: {result['files']['png']} (data: {result['files']['csv']})")
    return "\n".join(lines) + "\n"


def _noise_lines(base: str, noise: dict | None, users: int) -> list[str]:
    """The baseline's two runs and the spread they set: what a difference has to beat."""
    if not noise:
        return []
    lines = ["", f"noise (the baseline {base} measured twice):"]
    for kind, label in (("single", "single-stream decode median"), ("load", f"{users} users aggregate")):
        n = noise[kind]
        within = f", request-to-request {n['request_spread']:.1%}" if n.get("request_spread") is not None else ""
        lines.append(f"  {label}: {_f(n['runs'][0])} then {_f(n['runs'][1])} tok/s, run-to-run "
                     f"{n['run_to_run_spread']:.1%}{within}; a difference must exceed {n['noise']:.1%}")
    return lines


def render_sweep(result: dict, json_path, csv_path, png_path) -> str:
    """`loadtest --sweep`: one row per concurrency, and where the files are."""
    from .sweep import point_validity, sweep_warning

    lines = _header(result, "gptoss-spark loadtest --sweep")
    warning = sweep_warning(result)
    if warning:
        lines += [warning, ""]
    headers = ["users", "aggregate tok/s", "per-user tok/s", "TTFT p50 s", "TTFT p95 s", "requests", "invalid", "note"]
    rows = [[str(p["concurrency"]), _f(p["aggregate_tok_s"]), _f(p["per_user_tok_s"]), _f(p["ttft_p50_s"], ".3f"),
             _f(p["ttft_p95_s"], ".3f"), str(p["requests"]), str(p["invalid_requests"]),
             "" if point_validity(p) == "valid" else point_validity(p).upper() + ": not a measurement"]
            for p in result["points"]]
    lines += _table(headers, rows, right=set(range(len(headers) - 1)))
    for p in result["points"]:
        for reason in p["invalid_reasons"]:
            lines.append(f"  {p['concurrency']} users: invalid: {reason}")
    if not result["host"].get("is_dgx_spark"):
        lines.append("this host is not a DGX Spark: its numbers say nothing about a Spark")
    lines += ["", f"JSON {json_path}", f"CSV  {csv_path}", f"PNG  {png_path}"]
    return "\n".join(lines) + "\n"


def _switch_cell(sw: dict | None) -> str:
    if sw is None:
        return "-"
    if not sw["ok"]:
        return "FAILED"
    return "active" if sw["noop"] else f"ok {sw['seconds']:.0f} s"


def render_arena(result: dict) -> str:
    """`bench arena`: llama-benchy's figures per point, validity, the headline beside the leaderboard's."""
    p, s = result["protocol"], result["summary"]
    lines = _where(result, "gptoss-spark bench arena")
    lines.append(f"protocol: llama-benchy {p['llama_benchy'] or '(version unknown)'}, Spark Arena {p['profile']} "
                 f"settings: pp{p['pp']}, tg{p['tg']}, {p['runs']} run(s), prefix caching, {len(p['points'])} "
                 f"point(s)" + (", coherence test skipped" if p["skip_coherence"] else ""))
    lines.append(f"offline: corpus {p['corpus']}, tokenizer {p['tokenizer']}")
    lines.append("")
    rows = []
    for pt in result["points"]:
        if not pt["figures"]:
            rows.append([str(pt["depth"]), str(pt["concurrency"]), "-", "-", "", "", "", "INVALID: " + pt["error"]])
        for f in pt["figures"]:
            tok = f["tok_s"] or {}
            peak = (f.get("peak_tok_s") or {}).get("mean")
            ttft = (f.get("e2e_ttft_ms") or {}).get("mean")
            rows.append([str(f["depth"]), str(f["concurrency"]), f["test"], _f(tok.get("mean")), _f(tok.get("std")),
                         _f(peak, none=""), _f(ttft, ".0f", none=""),
                         "" if f["valid"] else "INVALID: " + f["invalid_reason"]])
    lines += _table(["depth", "conc", "test", "t/s", "± std", "peak t/s", "e2e TTFT ms", "note"], rows,
                    right={0, 1, 3, 4, 5, 6})
    lines += ["", f"figures: {s['valid_figures']}/{s['figures']} valid; points run: {s['points_run']}/{s['points']}"]
    dec = f"{_f(s['decode_tok_s'])} tok/s" if s["decode_valid"] else "INVALID"
    pre = f"{_f(s['prefill_tok_s'])} tok/s" if s["prefill_valid"] else "INVALID"
    lines.append(f"headline (depth 0, 1 stream): tg{p['tg']} {dec}; pp{p['pp']} {pre}"
                 + (f", e2e TTFT {s['e2e_ttft_ms']:.0f} ms" if s["e2e_ttft_ms"] is not None else ""))
    lines += render_speculation(result.get("speculation"))
    lines += ["", f"reference ({ARENA_LABEL}): {ARENA_WHAT}"]
    lines += [f"  {where}: {value} tok/s" for where, value in ARENA_DECODE_TOK_S.items()]
    if not result["host"].get("is_dgx_spark"):
        lines.append("  this host is not a DGX Spark: its numbers are not comparable with the leaderboard's")
    if p["differs_from_arena"]:
        lines.append("  this run's settings differ from the leaderboard's: " + "; ".join(p["differs_from_arena"]))
    return "\n".join(lines) + "\n"
