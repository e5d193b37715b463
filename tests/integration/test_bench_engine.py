"""bench, loadtest, bench arena and draft counts/shrink against ONE real vLLM engine serving the tiny demo model.

Random weights: streamed chat arrives as one delta, so per-token timing is
checked on /v1/completions (one chunk per token, ignore_eos for exact
lengths); chat is checked for being flagged, not crashing. bench arena (llama-benchy,
chat only) must report its decode figures invalid for that reason and may keep the
prefill ones. Speed is measured and printed, never asserted.
"""

import json

import pytest

from gptoss_spark.cli import main
pytestmark = pytest.mark.integration

DEAD_ADMIN = "http://127.0.0.1:9"  # keep the snapshot independent of any admin API running nearby


@pytest.fixture(scope="module")
def engine(demo_vllm_server):
    """The suite's shared engine (tests/conftest.py): no start of our own."""
    return demo_vllm_server


def run_json(capsys, argv):
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, json.loads(captured.out)


def test_single_stream_protocol(engine, capsys, tmp_path):
    out = tmp_path / "bench.json"
    rc, res = run_json(capsys, ["bench", "--url", engine.base_url, "--endpoint", "completions", "--ignore-eos",
                                "--max-tokens", "24", "--requests", "2", "--warmup", "1", "--no-progress",
                                "--admin-url", DEAD_ADMIN, "--json", "--out", str(out)])
    assert rc == 0, res["invalid"]
    assert json.loads(out.read_text())["summary"] == res["summary"]
    assert len(res["warmup"]) == 1 and len(res["requests"]) == 2
    for r in res["requests"]:
        assert r["valid"], r["invalid_reason"]
        assert r["completion_tokens"] == 24  # from the server's usage (ignore_eos: exact)
        assert r["prompt_tokens"] > 0
        assert r["finish_reason"] == "length"
        # TTFT strictly before decode; decode window from first to last output
        assert r["sent_at"] < r["first_output_at"] < r["last_output_at"] <= r["ended_at"]
        assert r["decode_tok_s"] == pytest.approx(23 / (r["last_output_at"] - r["first_output_at"]))
        assert r["output_chunks"] >= 2
    s = res["summary"]
    assert s["valid_requests"] == 2
    assert s["decode_tok_s"]["median"] == pytest.approx(sum(r["decode_tok_s"] for r in res["requests"]) / 2)
    assert res["target"]["model"] == "gptoss" and "0.32.0" in (res["target"]["server_version"] or "")
    host = res["host"]
    assert host["is_dgx_spark"] is False and host["memory"]["total_bytes"] > 0
    assert host["active_profile"]["active"] is None and host["active_profile"]["reason"]
    print(f"\n[tiny CPU model, not a Spark] single stream: decode {s['decode_tok_s']['median']:.1f} tok/s, "
          f"TTFT {s['ttft_s']['median'] * 1000:.0f} ms")


def test_chat_on_random_weights_is_flagged_not_crashed(engine, capsys):
    rc, res = run_json(capsys, ["bench", "--url", engine.base_url, "--max-tokens", "16", "--requests", "1",
                                "--warmup", "0", "--no-progress", "--admin-url", DEAD_ADMIN, "--json"])
    assert rc == 1
    r = res["requests"][0]
    assert r["completion_tokens"] is not None and r["completion_tokens"] >= 1  # usage still arrives
    assert "one chunk" in r["invalid_reason"] or "completion token" in r["invalid_reason"]
    assert res["protocol"]["reasoning_effort"] == "low"


def test_loadtest_users_are_served_concurrently(engine, capsys):
    users, tokens = 3, 24
    rc, res = run_json(capsys, ["loadtest", "--url", engine.base_url, "--endpoint", "completions", "--ignore-eos",
                                "--max-tokens", str(tokens), "--users", str(users), "--warmup", "1",
                                "--no-progress", "--admin-url", DEAD_ADMIN, "--json"])
    assert rc == 0, res["invalid"]
    s = res["summary"]
    assert s["completion_tokens_total"] == users * tokens
    assert s["aggregate_tok_s"] == pytest.approx(users * tokens / s["makespan_s"])
    # Server-side evidence: every user's first token came before any user's last token.
    reqs = res["requests"]
    assert max(r["first_output_at"] for r in reqs) < min(r["last_output_at"] for r in reqs)
    assert s["observed_concurrency"] == users
    assert s["ttft_s"]["p50"] <= s["ttft_s"]["p90"]
    print(f"\n[tiny CPU model, not a Spark] {users} users: aggregate {s['aggregate_tok_s']:.1f} tok/s, "
          f"TTFT p50 {s['ttft_s']['p50'] * 1000:.0f} ms, per-user {s['per_user_decode_tok_s']['median']:.1f} tok/s")


def test_loadtest_sweep_writes_json_csv_and_a_png(engine, capsys, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    out = tmp_path / "sweep.json"
    rc = main(["loadtest", "--url", engine.base_url, "--endpoint", "completions", "--ignore-eos", "--max-tokens", "8",
               "--sweep", "1,3", "--sweep-seconds", "1", "--warmup", "0", "--no-progress", "--admin-url", DEAD_ADMIN,
               "--out", str(out)])
    text = capsys.readouterr().out
    res = json.loads(out.read_text())
    assert rc == 0, res["points"]
    assert res["kind"] == "gptoss-spark.sweep" and res["protocol"]["concurrencies"] == [1, 3]
    one, three = res["points"]
    for p, users in ((one, 1), (three, 3)):
        assert p["concurrency"] == users and p["invalid_requests"] == 0
        assert p["requests"] >= users  # every user sent at least one, back to back for 1 s
        assert p["completion_tokens_total"] == 8 * p["requests"]  # ignore_eos: exact
        assert p["aggregate_tok_s"] == pytest.approx(p["completion_tokens_total"] / p["makespan_s"])
        assert 0 < p["ttft_p50_s"] <= p["ttft_p95_s"] and p["per_user_tok_s"] > 0
    assert three["observed_concurrency"] >= 2  # the demo engine has 4 slots: users decode together
    rows = (tmp_path / "sweep.csv").read_text().splitlines()
    assert rows[0].split(",")[:3] == ["profile", "concurrency", "requests"] and len(rows) == 3
    png = tmp_path / "sweep.png"
    assert png.stat().st_size > 10_000
    assert image.imread(png).shape[:2] == (500, 1600)  # 16 x 5 in at 100 dpi: it decodes
    assert "sweep.png" in text and "not a DGX Spark" in text
    print(f"\n[tiny CPU model, not a Spark] sweep: 1 user {one['aggregate_tok_s']:.1f} tok/s, "
          f"3 users {three['aggregate_tok_s']:.1f} tok/s")


def make_full_vocab_head(path, vocab=201088, hidden=8):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    path.mkdir()
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": hidden, "draft_vocab_size": None,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}))  # three layers feed fc (3 x hidden), as verify checks
    save_file({"lm_head.weight": torch.zeros(vocab, hidden, dtype=torch.bfloat16),
               "fc.weight": torch.zeros(hidden, 3 * hidden, dtype=torch.bfloat16)}, str(path / "model.safetensors"))
    return path


def test_draft_shrink_with_counts_from_the_served_target(engine, capsys, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": text}]}) + "\n"
                               for i, text in enumerate(["Hello there", "Wie geht es dir?"])))
    head = make_full_vocab_head(tmp_path / "head")
    out = tmp_path / "cut"
    rc, report = run_json(capsys, ["draft", "shrink", str(head), str(out), "--keep", "64", "--url", engine.base_url,
                                   "--prompts", str(prompts), "--max-tokens", "8", "--json"])
    assert rc == 0, report["verify"]["problems"]
    cov = report["coverage"]
    assert 0 < cov["counted_tokens"] <= 2 * 8  # token ids the target generated, 8 at most per prompt
    assert cov["distinct_counted"] <= 16 < 64
    assert cov["coverage"] == 1.0  # every token seen fits in 64 rows
    counts = json.loads((out / "token-counts.json").read_text())
    assert counts["total_tokens"] == cov["counted_tokens"]
    assert all(0 <= int(t) < 201088 for t in counts["counts"])
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 64


def test_arena_runs_llama_benchy_offline_and_flags_one_chunk_decode(engine, capsys, tmp_path):
    from gptoss_spark.bench.render import render_arena

    pytest.importorskip("llama_benchy")
    out = tmp_path / "arena.json"
    # Two small points (one with a prefix-cached context) and one that cannot fit max_model_len 1024.
    rc, res = run_json(capsys, ["bench", "arena", "--url", engine.base_url, "--tokenizer", str(engine.model_dir),
                                "--depth", "0", "128", "2048", "--concurrency", "1", "--pp", "64", "--tg", "8",
                                "--runs", "1", "--skip-coherence", "--no-progress", "--admin-url", DEAD_ADMIN,
                                "--json", "--out", str(out)])
    assert rc == 1  # decode figures invalid, one point not run
    assert json.loads(out.read_text())["summary"] == res["summary"]
    p = res["protocol"]
    assert p["llama_benchy"] == "0.4.0" and p["enable_prefix_caching"] and p["corpus"].startswith("shipped:")
    assert p["differs_from_arena"]  # pp64/tg8, one run, 3 points, no coherence test
    d0, d128, d2048 = res["points"]
    assert (d2048["ran"], d2048["figures"]) == (False, []) and "max_model_len 1024" in d2048["error"]
    for pt in (d0, d128):
        # error None: llama-benchy exited 0, wrote JSON, read the shipped corpus from its cache, kept our tokenizer
        assert pt["ran"] and pt["error"] is None, pt["log_tail"]
        assert pt["llama_benchy"]["version"] == "0.4.0"
    assert [f["test"] for f in d0["figures"]] == ["pp64", "tg8"]
    assert [f["test"] for f in d128["figures"]] == ["ctx_pp @ d128", "ctx_tg @ d128", "pp64 @ d128", "tg8 @ d128"]
    for f in d0["figures"] + d128["figures"]:
        if f["kind"] == "prefill":
            assert f["valid"], f["invalid_reason"]
            assert f["tok_s"]["mean"] > 0 and len(f["tok_s"]["values"]) == 1
        else:  # one chunk per response: no decode interval, whatever llama-benchy's peak says
            assert not f["valid"] and "one chunk" in f["invalid_reason"]
    s = res["summary"]
    assert (s["decode_valid"], s["decode_tok_s"]) == (False, None)
    assert s["prefill_valid"] and s["prefill_tok_s"] == d0["figures"][0]["tok_s"]["mean"]
    assert (s["points"], s["points_run"], s["invalid_figures"]) == (3, 2, 3)
    table = render_arena(res)
    assert "INVALID: no decode interval" in table and "58.82" in table and "not a DGX Spark" in table
    print(f"\n[tiny CPU model, not a Spark] llama-benchy pp64: {s['prefill_tok_s']:.0f} tok/s (decode invalid)")


def test_the_gate_records_the_set_and_judges_a_rerun_of_itself_alike(engine):
    """bench/gate.py's recorder against the real engine: every item answered and parsed, greedy tokens with
    their top-2 margins; the same engine twice agrees token for token. Random weights fail exact answers and
    may fail structure, so only the greedy part's verdict is asserted here (the rest: test_bench_gate.py)."""
    from gptoss_spark.bench.gate import gate_items, judge, record_gate
    from gptoss_spark.bench.target import resolve_target

    target = resolve_target(engine.base_url, None)
    greedy_only = [i for i in gate_items() if i.part == "greedy"][:3]
    chat = [i for i in gate_items() if i.part in ("tool", "content")]
    first = record_gate(target, timeout=120, items=greedy_only + chat)
    again = record_gate(target, timeout=120, items=greedy_only)
    assert set(first["items"]) == {i.id for i in greedy_only + chat}
    for item in greedy_only:
        rec = first["items"][item.id]
        assert rec["error"] is None and len(rec["tokens"]) == 32 and rec["tokens"][0].startswith("token_id:")
        assert len(rec["top2_margins"]) == 32 and all(m is None or m >= 0 for m in rec["top2_margins"])
    for item in chat:  # answered and parsed (the verdict on random weights is not the point)
        assert first["items"][item.id]["error"] is None and first["items"][item.id]["finish_reason"]
    reference = {**first, "items": {k: v for k, v in first["items"].items() if v["part"] == "greedy"}}
    verdict = judge(reference, again)
    assert verdict["greedy"]["token_agreement"] == 1.0 and verdict["verdict"] == "correct", verdict
