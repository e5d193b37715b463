"""Draft vocabulary shrink on a tiny Eagle3-format head the test writes itself.

The head mirrors what vLLM 0.32.0's Eagle3LlamaForCausalLM.load_weights reads:
`midlayer.*`, `fc.weight`, `norm.weight`, `lm_head.weight` [draft_vocab_size,
hidden], optional `d2t` (int64 offsets: target = draft + d2t[draft]) and `t2d`.
"""

import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from gptoss_spark.cli import main  # noqa: E402
from gptoss_spark.draft.counts import TokenCounts, load_counts, save_counts  # noqa: E402
from gptoss_spark.draft.shrink import REPORT_NAME, WEIGHTS_NAME, select_kept, shrink_head  # noqa: E402
from gptoss_spark.draft.verify import verify_head  # noqa: E402
from gptoss_spark.base.errors import UserError  # noqa: E402

V, H = 64, 8  # target vocab, hidden
AUX_LAYERS = [1, 3, 5]  # of a target with TARGET_LAYERS layers
TARGET_LAYERS = 8


def make_head(path, *, draft_vocab=None, speculators=False, kept=None):
    """Eagle3 head; lm_head row r is filled with r so rows can be traced after the cut."""
    path.mkdir(parents=True, exist_ok=True)
    k = draft_vocab or V
    if speculators:
        cfg = {"speculators_model_type": "eagle3", "draft_vocab_size": draft_vocab,
               "transformer_layer_config": {"model_type": "llama", "vocab_size": V, "hidden_size": H}}
    else:
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "vocab_size": V,
               "hidden_size": H, "draft_vocab_size": draft_vocab, "torch_dtype": "bfloat16"}
    cfg["eagle_aux_hidden_state_layer_ids"] = AUX_LAYERS  # fc below takes 3 x H
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "README.md").write_text("tiny test head\n")
    g = torch.Generator().manual_seed(0)
    tensors = {
        "fc.weight": torch.randn(H, 3 * H, generator=g).to(torch.bfloat16),
        "norm.weight": torch.ones(H, dtype=torch.bfloat16),
        "midlayer.self_attn.q_proj.weight": torch.randn(H, 2 * H, generator=g).to(torch.bfloat16),
        "lm_head.weight": torch.arange(k, dtype=torch.float32).repeat_interleave(H).view(k, H).to(torch.bfloat16),
    }
    if draft_vocab:
        kept = torch.tensor(kept, dtype=torch.long)
        tensors["d2t"] = kept - torch.arange(k)
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[kept] = True
        tensors["t2d"] = t2d
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def read(path):
    with safe_open(str(path / WEIGHTS_NAME), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


COUNTS = TokenCounts(counts=Counter({5: 100, 60: 50, 7: 30, 33: 30, 2: 10, 40: 5}), source="test")


def test_select_kept_orders_by_count_then_id():
    assert select_kept(list(range(V)), COUNTS, 3) == [5, 7, 60]  # 7 beats 33 on the tie (lower id)
    assert select_kept(list(range(V)), COUNTS, 8) == [0, 1, 2, 5, 7, 33, 40, 60]  # unseen: lowest ids


def test_shrink_writes_the_format_vllm_reads(tmp_path):
    src = make_head(tmp_path / "src")
    report = shrink_head(src, tmp_path / "out", 4, COUNTS)
    out = tmp_path / "out"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 4 and cfg["vocab_size"] == V
    t = read(out)
    assert t["lm_head.weight"].shape == (4, H)
    assert t["d2t"].dtype == torch.int64 and t["d2t"].shape == (4,)
    kept = [5, 7, 33, 60]
    assert (torch.arange(4) + t["d2t"]).tolist() == kept
    # each kept row is the source row of that target token (rows were filled with their index)
    assert t["lm_head.weight"][:, 0].float().tolist() == [float(x) for x in kept]
    assert t["t2d"].shape == (V,) and t["t2d"].dtype == torch.bool and t["t2d"].nonzero().flatten().tolist() == kept
    assert torch.equal(t["fc.weight"], read(src)["fc.weight"])
    assert (out / "README.md").exists() and (out / REPORT_NAME).exists()
    assert report["verify"]["ok"], report["verify"]["problems"]


def test_coverage_arithmetic(tmp_path):
    report = shrink_head(make_head(tmp_path / "src"), tmp_path / "out", 4, COUNTS)
    cov = report["coverage"]
    assert cov["counted_tokens"] == 225
    assert cov["covered_tokens"] == 100 + 50 + 30 + 30
    assert cov["coverage"] == pytest.approx(210 / 225)
    assert cov["distinct_counted"] == 6 and cov["distinct_covered"] == 4
    assert report["source_coverage"]["coverage"] == 1.0
    assert report["kept_without_counts"] == 0


def test_shrinking_an_already_cut_head_follows_its_d2t(tmp_path):
    src_kept = [2, 5, 7, 10, 33, 50, 60, 63]  # the source head only has these 8 rows
    src = make_head(tmp_path / "src", draft_vocab=8, kept=src_kept)
    report = shrink_head(src, tmp_path / "out", 3, COUNTS)
    t = read(tmp_path / "out")
    assert (torch.arange(3) + t["d2t"]).tolist() == [5, 7, 60]
    # source rows of tokens 5, 7, 60 are rows 1, 2, 6 of the cut source head
    assert t["lm_head.weight"][:, 0].float().tolist() == [1.0, 2.0, 6.0]
    assert report["source_coverage"]["covered_tokens"] == 225 - 5  # token 40 was never in the source
    assert report["verify"]["ok"]


def test_speculators_config_keeps_vocab_under_transformer_layer_config(tmp_path):
    src = make_head(tmp_path / "src", speculators=True)
    report = shrink_head(src, tmp_path / "out", 4, COUNTS)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 4 and cfg["transformer_layer_config"]["vocab_size"] == V
    assert report["verify"]["ok"]


def test_keep_everything_writes_no_d2t(tmp_path):
    # vLLM 0.32.0 has no draft_id_to_target_id parameter when draft == target vocab
    report = shrink_head(make_head(tmp_path / "src"), tmp_path / "out", V, COUNTS)
    assert "d2t" not in read(tmp_path / "out") and report["verify"]["ok"]


def test_verify_finds_broken_heads(tmp_path):
    src = make_head(tmp_path / "src")
    shrink_head(src, tmp_path / "out", 4, COUNTS)
    out = tmp_path / "out"
    t = read(out)
    t["d2t"] = torch.tensor([5, 4, 30, 57])  # targets 5, 5, 32, 60: duplicate and disagrees with t2d
    save_file(t, str(out / WEIGHTS_NAME))
    problems = verify_head(out)["problems"]
    assert any("same target token" in p for p in problems)
    assert any("t2d and d2t disagree" in p for p in problems)

    t["d2t"] = torch.tensor([5, 6, 31, 100], dtype=torch.int32)  # int32 loads in vLLM; 103 is out of range
    save_file(t, str(out / WEIGHTS_NAME))
    problems = verify_head(out)["problems"]
    assert not any("dtype" in p for p in problems) and any("outside the target vocabulary" in p for p in problems)

    t["d2t"] = torch.tensor([5.0, 6.0, 31.0, 57.0])  # float offsets would be rounded silently
    save_file(t, str(out / WEIGHTS_NAME))
    assert any("must be an integer tensor" in p for p in verify_head(out)["problems"])

    cfg = json.loads((out / "config.json").read_text())
    cfg["draft_vocab_size"] = 5
    (out / "config.json").write_text(json.dumps(cfg))
    problems = verify_head(out)["problems"]
    assert any("rows must equal draft_vocab_size 5" in p for p in problems)


def test_bad_inputs_are_one_line_errors(tmp_path):
    src = make_head(tmp_path / "src")
    with pytest.raises(UserError, match="out of range"):
        shrink_head(src, tmp_path / "o1", V + 1, COUNTS)
    with pytest.raises(UserError, match="another model's vocabulary"):
        shrink_head(src, tmp_path / "o2", 4, TokenCounts(counts=Counter({V + 3: 1})))
    with pytest.raises(UserError, match="is the source head"):
        shrink_head(src, src, 4, COUNTS)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(UserError, match="--force"):
        shrink_head(src, tmp_path / "busy", 4, COUNTS)
    with pytest.raises(UserError, match="not a directory"):
        shrink_head(tmp_path / "nope", tmp_path / "o3", 4, COUNTS)


def test_counts_file_formats(tmp_path):
    f = tmp_path / "c.json"
    save_counts(COUNTS, f)
    assert load_counts(f).counts == COUNTS.counts
    f.write_text(json.dumps({"3": 2, "9": 0}))
    assert load_counts(f).counts == Counter({3: 2})
    f.write_text(json.dumps([0, 4, 1]))
    assert load_counts(f).counts == Counter({1: 4, 2: 1})
    for bad in ('{"x": 1}', '{"1": -2}', '"text"', "[0, 0]"):
        f.write_text(bad)
        with pytest.raises(UserError):
            load_counts(f)


def test_cli_shrink_and_verify(tmp_path, capsys):
    src = make_head(tmp_path / "src")
    counts = tmp_path / "counts.json"
    save_counts(COUNTS, counts)
    assert main(["draft", "shrink", str(src), str(tmp_path / "out"), "--keep", "4", "--counts", str(counts)]) == 0
    out = capsys.readouterr().out
    assert "cut 64 -> 4" in out and "93.33 %" in out and "verify: ok" in out
    assert main(["draft", "verify", str(tmp_path / "out"), "--counts", str(counts), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["coverage"]["covered_tokens"] == 210
    assert main(["draft", "shrink", str(src), str(tmp_path / "out2"), "--keep", "4", "--counts",
                 str(tmp_path / "missing.json")]) == 2
    assert "cannot read counts file" in capsys.readouterr().err


def write_target(path, layers=TARGET_LAYERS):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "hidden_size": H}))
    return path


def set_config(head, **changes):
    cfg = json.loads((head / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (head / "config.json").write_text(json.dumps(cfg))


def test_aux_layers_are_checked_against_the_fc_and_the_target(tmp_path):
    """vLLM 0.32.0 feeds fc the target's aux layers (ids from the config, else silently its defaults):
    ids missing, too few for fc's inputs, or outside the target are each a problem."""
    head, target = make_head(tmp_path / "head"), write_target(tmp_path / "target")
    report = verify_head(head, target_dir=target)
    assert report["ok"], report["problems"]
    assert report["aux_layers"] == {"aux_layer_ids": AUX_LAYERS, "aux_count": 3, "target_hidden_size": H,
                                    "fc_in_features": 3 * H, "target_layers": TARGET_LAYERS}

    set_config(head, eagle_aux_hidden_state_layer_ids=None)
    problems = verify_head(head, target_dir=target)["problems"]
    assert len(problems) == 1 and "no eagle_aux_hidden_state_layer_ids" in problems[0]
    assert "default layers [2, 4, 5]" in problems[0]  # (2, L/2, L-3) for the 8-layer target

    set_config(head, eagle_aux_hidden_state_layer_ids=[1, 5])
    problems = verify_head(head, target_dir=target)["problems"]
    assert problems == [f"fc takes {3 * H} inputs, but 2 aux layers x target hidden {H} = {2 * H}: the config and "
                        "the weights disagree on how many layers feed the head"]

    set_config(head, eagle_aux_hidden_state_layer_ids=[1, 5, 9])
    assert any("aux layer ids [9] outside the target's layers 0..7" in p
               for p in verify_head(head, target_dir=target)["problems"])
    assert verify_head(head)["ok"]  # without the target only fc and the config are compared

    set_config(head, eagle_aux_hidden_state_layer_ids=None, eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYERS})
    assert verify_head(head, target_dir=target)["ok"]  # vLLM also reads them under eagle_config


def test_cli_verify_with_target_prints_the_aux_problem(tmp_path, capsys):
    head, target = make_head(tmp_path / "head"), write_target(tmp_path / "target", layers=4)
    rc = main(["draft", "verify", str(head), "--target", str(target)])
    out = capsys.readouterr().out
    assert rc == 1 and "verify: PROBLEM: aux layer ids [5] outside the target's layers 0..3" in out


def test_counts_are_gathered_with_the_engines_key(tmp_path):
    """draft counts against a keyed engine: the key file's key goes on every request (a real HTTP
    server on 127.0.0.1 that answers 401 without it)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Keyed(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            if self.headers.get("Authorization") != "Bearer s3cret":
                return self._answer(401, {"error": "unauthorized"})
            self._answer(200, {"data": [{"id": "gptoss", "max_model_len": 1024}]} if self.path == "/v1/models"
                         else {"version": "0.32.0"})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers.get("Authorization"))
            if self.headers.get("Authorization") != "Bearer s3cret":
                return self._answer(401, {"error": "unauthorized"})
            self._answer(200, {"choices": [{"token_ids": [5, 5, 7]}]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Keyed)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        key = tmp_path / "api.key"
        key.write_text("s3cret\n")
        prompts = tmp_path / "p.jsonl"
        prompts.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
        out = tmp_path / "counts.json"
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert main(["draft", "counts", "--url", url, "--api-key-file", str(key), "--prompts", str(prompts),
                     "--out", str(out)]) == 0
        assert load_counts(out).counts == Counter({5: 2, 7: 1})
        assert seen and set(seen) == {"Bearer s3cret"}
    finally:
        server.shutdown()
