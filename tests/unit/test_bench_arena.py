"""bench arena: the Spark Arena settings, judging llama-benchy's figures, the offline corpus, the key.

The real run (llama-benchy against the tiny engine) is in tests/integration/test_bench_engine.py.
Here: the pieces, llama-benchy's own corpus loader reading the seeded cache, and a stand-in
server that sees the key llama-benchy sends.
"""

from __future__ import annotations

import hashlib
import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gptoss_spark.bench import arena, benchy
from gptoss_spark.bench.compare import compare
from gptoss_spark.bench.render import render_arena
from gptoss_spark.bench.target import Target
from gptoss_spark.cli import main

TARGET = Target(base_url="http://127.0.0.1:1", model="gptoss", served_models=("gptoss",), max_model_len=1024,
                server_version="0.32.0")


def metric(*values):
    return {"mean": sum(values) / len(values), "std": 0.0, "values": list(values)}


def run_entry(depth=0, conc=1, pp=None, tg=None, peak=None, ctx=False):
    return {"concurrency": conc, "context_size": depth, "prompt_size": 2048, "response_size": 128,
            "is_context_prefill_phase": ctx, "pp_throughput": pp, "pp_req_throughput": pp, "tg_throughput": tg,
            "tg_req_throughput": tg, "peak_throughput": peak, "peak_req_throughput": peak,
            "ttfr": metric(300.0) if pp else None, "est_ppt": metric(290.0) if pp else None,
            "e2e_ttft": metric(310.0) if pp else None}


def test_default_schedule_is_the_profiles_28_points_once_each():
    points = arena.schedule(None, None)
    assert len(points) == len(set(points)) == 28
    assert set(points) == {(d, c) for d in arena.DEPTHS for c in arena.CONCURRENCY}
    assert arena.schedule([0, 4096], None) == [(0, c) for c in arena.CONCURRENCY] + [(4096, c) for c in arena.CONCURRENCY]
    assert arena.schedule(None, [1]) == [(d, 1) for d in arena.DEPTHS]


def test_points_that_overflow_the_context_are_not_sent():
    assert arena.fits(0, 2048, 128, 32768) and arena.fits(30592, 2048, 128, 32768)
    assert not arena.fits(30593, 2048, 128, 32768)
    assert arena.fits(100000, 2048, 128, None)  # max_model_len unknown: send, the server decides


def test_figures_judge_decode_and_prefill_separately():
    raw = {"benchmarks": [
        run_entry(pp=metric(5000, 5100, 4900), tg=metric(58, 59, 60), peak=metric(61, 62, 63)),
        # one chunk per response: llama-benchy leaves t/s blank and its peak is tokens per 1 s
        run_entry(depth=4096, ctx=True, pp=metric(6000, 6100, 6200), tg=None, peak=metric(128, 128, 128)),
        run_entry(depth=4096, pp=metric(4000, 4100), tg=metric(50, 51, 52)),  # a run without prefill figure
    ]}
    figs = arena.figures(raw, runs=3)
    assert [f["test"] for f in figs] == ["pp2048", "tg128", "ctx_pp @ d4096", "ctx_tg @ d4096",
                                         "pp2048 @ d4096", "tg128 @ d4096"]
    assert [f["valid"] for f in figs] == [True, True, True, False, False, True]
    assert "one chunk" in figs[3]["invalid_reason"] and figs[3]["peak_tok_s"]["mean"] == 128  # kept, but invalid
    assert figs[4]["invalid_reason"] == "only 2 of 3 runs gave a prefill figure"
    assert figs[0]["e2e_ttft_ms"]["mean"] == 310.0


def point(depth, conc, figs, error=None, ran=True):
    return {"depth": depth, "concurrency": conc, "ran": ran, "error": error, "figures": figs, "exit_code": 0,
            "llama_benchy": None, "log_tail": []}


def protocol(**over):
    p = {"tool": "llama-benchy", "llama_benchy": "0.4.0", "profile": arena.PROFILE_NAME, "pp": arena.PP,
         "tg": arena.TG, "runs": arena.RUNS, "points": [list(x) for x in arena.SCHEDULE], "skip_coherence": False,
         "enable_prefix_caching": True, "exit_on_first_fail": True, "latency_mode": "api",
         "tokenizer": "/srv/models/gpt-oss-120b/tokenizer.json", "corpus": "shipped:sherlock-holmes-i-ii.txt"}
    p.update(over)
    p["differs_from_arena"] = arena.same_as_arena(p)
    return p


def make_result(tg=None, proto=None):
    figs = arena.figures({"benchmarks": [run_entry(pp=metric(5000, 5000, 5000), tg=tg, peak=metric(64, 64, 64))]}, 3)
    points = [point(0, 1, figs), point(65535, 1, [], error="not run: exceeds the served max_model_len 32768",
                                       ran=False)]
    host = {"hostname": "h", "machine": "x86_64", "is_dgx_spark": False, "gpu": {"gpus": None},
            "active_profile": {"active": "plain"}, "patch_manifest": {}}
    return arena.arena_result(TARGET, proto or protocol(), points, host, datetime.now(timezone.utc))


def test_result_headline_counts_and_invalid_list():
    res = make_result(tg=None)
    s = res["summary"]
    assert res["kind"] == arena.RESULT_KIND_ARENA
    assert (s["decode_valid"], s["decode_tok_s"], s["prefill_valid"], s["prefill_tok_s"]) == (False, None, True, 5000)
    assert (s["points"], s["points_run"], s["points_failed"], s["figures"], s["invalid_figures"]) == (2, 1, 1, 2, 1)
    assert [(i["depth"], i["test"]) for i in res["invalid"]] == [(65535, None), (0, "tg128")]
    assert res["reference"]["decode_tok_s"] == {"single Spark": 58.82, "two Sparks, TP=2": 75.96}
    good = make_result(tg=metric(57, 58, 59))["summary"]
    assert (good["decode_valid"], good["decode_tok_s"]) == (True, 58)


def test_settings_differences_from_the_leaderboard():
    assert protocol()["differs_from_arena"] == []
    diff = protocol(pp=64, runs=1, points=[[0, 1]], skip_coherence=True)["differs_from_arena"]
    assert len(diff) == 4 and "pp64/tg128 instead of pp2048/tg128" in diff and "coherence test skipped" in diff


def test_table_labels_the_leaderboard_figures_as_theirs():
    table = render_arena(make_result(tg=None, proto=protocol(runs=1)))
    assert "Spark Arena leaderboard's figures, theirs, not measured here" in table
    assert "single Spark: 58.82 tok/s" in table and "two Sparks, TP=2: 75.96 tok/s" in table
    assert "INVALID: no decode interval" in table and "INVALID: not run" in table
    assert "tg128 INVALID" in table  # the headline says so instead of printing the artifact
    assert "not a DGX Spark" in table and "1 run(s) per point instead of 3" in table


def test_compare_two_arena_results():
    a, b = make_result(tg=metric(50, 50, 50)), make_result(tg=metric(60, 60, 60), proto=protocol(runs=1))
    cmp = compare(a, b)
    row = next(r for r in cmp["rows"] if r["metric"].startswith("decode tok/s"))
    assert row["ratio_b_over_a"] == pytest.approx(1.2)
    assert cmp["protocol_differences"]["runs"] == {"a": 3, "b": 1}


def test_llama_benchys_loader_reads_the_seeded_corpus_and_never_downloads(tmp_path, monkeypatch, demo_model_dir):
    corpus_mod = pytest.importorskip("llama_benchy.corpus")
    s = settings(demo_model_dir)
    home = tmp_path / "home"
    cached = benchy.seed_cache(home, s)
    assert cached.name == hashlib.md5(s.book_url.encode()).hexdigest() + ".txt"
    monkeypatch.setenv("HOME", str(home))

    def no_network(*a, **kw):
        raise AssertionError("llama-benchy tried to download the corpus")

    monkeypatch.setattr(corpus_mod.requests, "get", no_network)
    corpus = corpus_mod.TokenizedCorpus(s.book_url, str(s.tokenizer), "gptoss")
    assert isinstance(corpus.get_tokenizer(), corpus_mod.LightweightTokenizer)  # the model's tokenizer.json
    assert len(corpus) > 20000  # the two shipped stories, o200k tokens


def settings(model_dir: Path, **over) -> benchy.Settings:
    kw = dict(base_url="http://127.0.0.1:1", model="gptoss", tokenizer=model_dir / "tokenizer.json",
              corpus=benchy.shipped_corpus(), pp=64, tg=8, runs=1, skip_coherence=True, timeout=60.0)
    kw.update(over)
    return benchy.Settings(**kw)


def test_offline_problems_are_named():
    cache = Path("/h/.cache/llama-benchy/x.txt")
    assert benchy.offline_problem(f"Loading text from cache: {cache}\nok", cache) is None
    assert "did not read the shipped corpus" in benchy.offline_problem("Downloading book from http://x", cache)
    assert "fell back to gpt2" in benchy.offline_problem(
        f"Loading text from cache: {cache}\nFalling back to 'gpt2' tokenizer as approximation.", cache)


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        self.seen.append((self.path, self.headers.get("Authorization")))
        self._answer(200, {"data": [{"id": "gptoss"}]})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append((self.path, self.headers.get("Authorization")))
        self._answer(500, {"error": "stand-in"})

    def log_message(self, *a):
        pass


def test_key_reaches_the_server_but_not_llama_benchys_command_line(demo_model_dir):
    pytest.importorskip("llama_benchy")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        s = settings(demo_model_dir, base_url=f"http://127.0.0.1:{srv.server_address[1]}", api_key="k-secret-1")
        r = benchy.run_point(s, 0, 1)
    finally:
        srv.shutdown()
    assert ("/v1/chat/completions", "Bearer k-secret-1") in _Recorder.seen  # its warm-up, with our key
    assert "k-secret-1" not in " ".join(r["argv"])
    assert r["error"].startswith("llama-benchy exited 1") and "HTTP 500" in "\n".join(r["log_tail"])
    assert any("Loading text from cache" in ln for ln in r["log_tail"])  # offline even when it fails later


def test_missing_tokenizer_is_one_line_exit_2(capsys, tmp_path):
    rc = main(["bench", "arena", "--tokenizer", str(tmp_path / "nope"), "--url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "no tokenizer at" in err and "--tokenizer" in err
