"""The real-shape checkpoint writer (install/shaped_model.py): the same tensors as the published
checkpoint's layout, at the real sizes, deterministic, refused with a one-line reason when asked
for what it does not write."""

from __future__ import annotations

import json

import pytest

from gptoss_spark.install import demo_model as dm
from gptoss_spark.install import shaped_model as sm


def test_toy_sizes_give_exactly_the_demo_models_mxfp4_tensors(demo_model_mxfp4_dir):
    """With the demo model's own sizes, the writer's tensor list is what transformers and our
    quantizer wrote for the MXFP4 demo model, which vLLM serves in the integration tests: same
    names, shapes and dtypes, nothing more, nothing less."""
    from safetensors import safe_open

    with safe_open(demo_model_mxfp4_dir / "model.safetensors", "pt") as f:
        demo = {k: (tuple(f.get_slice(k).get_shape()), str(f.get_slice(k).get_dtype())) for k in f.keys()}
    ours = {t.name: (t.shape, {"bf16": "BF16", "u8": "U8"}[t.dtype])
            for tensors in sm.shards(dm.CONFIG_VALUES).values() for t in tensors}
    assert ours == demo


def test_gpt_oss_120b_shapes_and_size():
    values = sm.config_values("gpt-oss-120b", 2)
    tensors = {t.name: t for ts in sm.shards(values).values() for t in ts}
    assert tensors["model.layers.1.mlp.experts.gate_up_proj_blocks"].shape == (128, 5760, 90, 16)
    assert tensors["model.layers.1.mlp.experts.down_proj_scales"].shape == (128, 2880, 90)
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4096, 2880)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (512, 2880)
    assert tensors["lm_head.weight"].shape == (201088, 2880)
    size = sum((2 if t.dtype == "bf16" else 1) * __import__("math").prod(t.shape) for t in tensors.values())
    assert 5.7e9 < size < 5.9e9  # what the CLI's help says
    assert sm.config_values("gpt-oss-20b", 4)["num_local_experts"] == 32


def test_written_checkpoint_is_deterministic_and_scaled(tmp_path):
    """Written at toy sizes (the code path is the same): config and index agree with the shards, two
    writes with one seed give the same bytes, another seed does not, and the MXFP4 experts
    dequantize to weights of about the initializer's spread."""
    import torch
    from safetensors.torch import load_file

    from gptoss_spark.mxfp4 import dequantize_mxfp4

    a, b, c = (tmp_path / n for n in "abc")
    for d, seed in ((a, 3), (b, 3), (c, 4)):
        d.mkdir()
        sm._write_weights(d, dm.CONFIG_VALUES, seed)
    shard_names = sorted(p.name for p in a.glob("model-*.safetensors"))
    assert shard_names == sorted(sm.shards(dm.CONFIG_VALUES))
    for name in shard_names:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert any((a / n).read_bytes() != (c / n).read_bytes() for n in shard_names)
    index = json.loads((a / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shard_names)
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "mxfp4"
    assert cfg["num_local_experts"] == 4 and cfg["experts_per_token"] == 2
    layer = load_file(a / shard_names[1])
    blocks = layer["model.layers.0.mlp.experts.gate_up_proj_blocks"]
    e, n, kb, _ = blocks.shape
    w = dequantize_mxfp4(blocks.reshape(e, n, kb * 16), layer["model.layers.0.mlp.experts.gate_up_proj_scales"],
                         torch.float32)
    assert 0.01 < w.std().item() < 0.04
    assert torch.isfinite(w).all()


@pytest.mark.parametrize("kwargs, words", [
    ({"shape": "gpt-oss-7b"}, "expected one of gpt-oss-120b, gpt-oss-20b"),
    ({"layers": 0}, "expected 1 to 8"),
    ({"layers": 36}, "expected 1 to 8"),
])
def test_refuses_what_it_does_not_write(tmp_path, kwargs, words):
    with pytest.raises(sm.ShapedModelError, match=words):
        sm.make_shaped_model(tmp_path / "m", **kwargs)
    assert not (tmp_path / "m").exists()


def test_a_shaped_directory_is_not_taken_for_the_demo_model(tmp_path, monkeypatch):
    """Both kinds share the marker file: the toy builder must rebuild, not reuse, a shaped directory."""
    monkeypatch.setattr(sm, "config_values", lambda shape, layers: dm.CONFIG_VALUES)
    out = sm.make_shaped_model(tmp_path / "m", seed=0)
    marker = json.loads((out / dm.MARKER_NAME).read_text())
    assert (marker["shape"], marker["layers"]) == ("gpt-oss-120b", 2)
    assert not dm.is_complete(out, 0, "mxfp4")
    assert sm.make_shaped_model(out, seed=0) == out  # reused: same marker
