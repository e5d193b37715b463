"""A random-weight gpt-oss checkpoint with a published model's shapes and only a few layers.

`gptoss-spark shaped-model DIR --shape gpt-oss-120b --layers 2` writes it. The tiny demo model
(demo_model.py) has toy shapes, so the kernels and engine paths a GPU takes for the real model
(hidden 2880, 64 query and 8 KV heads of 64, 128 experts top-4 in MXFP4, the 201,088-token
lm_head) never meet it; this one has every tensor of the real checkpoint at its real shape and
dtype, with only `num_hidden_layers` cut (2-4 fit anywhere: 2 layers of gpt-oss-120b are 5.8 GB).

Written directly (no transformers model is built: 128 bf16 experts would be 6.4 GB a layer
before quantization), one safetensors shard per layer plus one for the embeddings, in the
published checkpoints' layout: bf16 attention, router, norms, sinks, embeddings and lm_head;
MXFP4 experts as `*_blocks` uint8 [E, N, K/32, 16] and E8M0 `*_scales` uint8 [E, N, K/32] with
bf16 `*_bias`. tests/unit/test_shaped_model.py holds the tensor list equal to what transformers
and our quantizer write for the demo model, which vLLM serves in the integration tests.

The weights are noise, deterministic from the seed (a CPU torch.Generator). The e2m1 codes are
uniform and the scales 2^-8..2^-6, so an expert weight has a standard deviation near 0.02, the
initializer range of the other weights. The tokenizer is the demo model's: the real
o200k_harmony, offline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..models.catalog import CATALOG
from . import demo_model
from .tiktoken_file import install_tiktoken_file

SHAPES_VERSION = 1  # bump when what a directory holds changes: an older one is rebuilt
MAX_LAYERS = 8      # the point is a checkpoint that fits anywhere; the real one is `model pull`

# The published openai/gpt-oss-120b and -20b config.json sizes: the expert count is the catalog's,
# the rest is the same in both; everything else (attention window, RoPE, vocabulary, special ids)
# is the demo model's, which is the published one's.
SHAPES: dict[str, dict] = {c.name: {"num_local_experts": c.experts} for c in CATALOG.values() if c.kind == "model"}
SHARED_SIZES = dict(hidden_size=2880, intermediate_size=2880, num_experts_per_tok=4, head_dim=64,
                    num_attention_heads=64, num_key_value_heads=8)
INIT_STD = demo_model.INIT_STD
SCALE_BYTES = (127 - 8, 127 - 6)  # E8M0 scales drawn: 2^-8..2^-6 (bias 127)


class ShapedModelError(demo_model.DemoModelError):
    """The shaped model could not be written."""


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "bf16" or "u8"
    fill: str   # "normal" (std 0.02), "ones", "codes" (random e2m1 pairs), "scales" (E8M0)


def config_values(shape: str, layers: int) -> dict:
    """GptOssConfig's arguments for a `layers`-layer checkpoint with `shape`'s sizes."""
    if shape not in SHAPES:
        raise ShapedModelError(f"shape {shape!r}: expected one of {', '.join(SHAPES)}")
    if not 1 <= layers <= MAX_LAYERS:
        raise ShapedModelError(f"layers={layers}: expected 1 to {MAX_LAYERS} (the real model is `gptoss-spark model "
                               "pull`)")
    return demo_model.CONFIG_VALUES | SHARED_SIZES | SHAPES[shape] | {"num_hidden_layers": layers}


def layer_tensors(cfg: dict, i: int) -> list[Tensor]:
    """Every tensor of decoder layer i, as the published MXFP4 checkpoints name and shape them."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    e, inter = cfg["num_local_experts"], cfg["intermediate_size"]
    p = f"model.layers.{i}"
    out = [
        Tensor(f"{p}.input_layernorm.weight", (h,), "bf16", "ones"),
        Tensor(f"{p}.post_attention_layernorm.weight", (h,), "bf16", "ones"),
        Tensor(f"{p}.self_attn.q_proj.weight", (q, h), "bf16", "normal"),
        Tensor(f"{p}.self_attn.q_proj.bias", (q,), "bf16", "normal"),
        Tensor(f"{p}.self_attn.k_proj.weight", (kv, h), "bf16", "normal"),
        Tensor(f"{p}.self_attn.k_proj.bias", (kv,), "bf16", "normal"),
        Tensor(f"{p}.self_attn.v_proj.weight", (kv, h), "bf16", "normal"),
        Tensor(f"{p}.self_attn.v_proj.bias", (kv,), "bf16", "normal"),
        Tensor(f"{p}.self_attn.o_proj.weight", (h, q), "bf16", "normal"),
        Tensor(f"{p}.self_attn.o_proj.bias", (h,), "bf16", "normal"),
        Tensor(f"{p}.self_attn.sinks", (cfg["num_attention_heads"],), "bf16", "normal"),
        Tensor(f"{p}.mlp.router.weight", (e, h), "bf16", "normal"),
        Tensor(f"{p}.mlp.router.bias", (e,), "bf16", "normal"),
    ]
    # Per expert W^T = [N, K] quantized along K (demo_model.EXPERT_MATRICES says which is which).
    for name, n, k in (("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)):
        out += [
            Tensor(f"{p}.mlp.experts.{name}_blocks", (e, n, k // 32, 16), "u8", "codes"),
            Tensor(f"{p}.mlp.experts.{name}_scales", (e, n, k // 32), "u8", "scales"),
            Tensor(f"{p}.mlp.experts.{name}_bias", (e, n), "bf16", "normal"),
        ]
    return out


def outer_tensors(cfg: dict) -> list[Tensor]:
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    return [
        Tensor("model.embed_tokens.weight", (v, h), "bf16", "normal"),
        Tensor("model.norm.weight", (h,), "bf16", "ones"),
        Tensor("lm_head.weight", (v, h), "bf16", "normal"),
    ]


def shards(cfg: dict) -> dict[str, list[Tensor]]:
    """File name -> its tensors: one shard per layer and one for the embeddings and lm_head."""
    n = cfg["num_hidden_layers"] + 1
    out = {f"model-{1:05d}-of-{n:05d}.safetensors": outer_tensors(cfg)}
    for i in range(cfg["num_hidden_layers"]):
        out[f"model-{i + 2:05d}-of-{n:05d}.safetensors"] = layer_tensors(cfg, i)
    return out


def _make(t: Tensor, g):
    import torch

    if t.fill == "ones":
        return torch.ones(t.shape, dtype=torch.bfloat16)
    return (torch.randn(t.shape, generator=g) * INIT_STD).to(torch.bfloat16)


def _shard(tensors: list[Tensor], g) -> dict:
    """One shard's tensors; each `*_blocks` is drawn with its `*_scales` by mxfp4.random_mxfp4."""
    from ..mxfp4 import random_mxfp4  # torch: not at import, the installer's CLI loads this module

    out = {}
    for t in tensors:
        if t.fill == "scales":
            continue  # drawn with its blocks, which come first
        if t.fill == "codes":
            e, n, kb, _ = t.shape
            packed, scales = random_mxfp4((e, n, kb * 32), generator=g, scale_exp=SCALE_BYTES)
            out[t.name] = packed.reshape(t.shape)
            out[t.name.removesuffix("_blocks") + "_scales"] = scales
        else:
            out[t.name] = _make(t, g)
    return out


def _write_weights(out: Path, values: dict, seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, GptOssConfig

    GptOssConfig(**values).save_pretrained(out)
    demo_model.finish_config(out / "config.json", "mxfp4")
    GenerationConfig(**demo_model.GENERATION_CONFIG).save_pretrained(out)
    g = torch.Generator().manual_seed(seed)
    weight_map = {}
    for file_name, tensors in shards(values).items():  # one shard in memory at a time
        save_file(_shard(tensors, g), out / file_name, metadata={"format": "pt"})
        weight_map |= {t.name: file_name for t in tensors}
    size = sum(p.stat().st_size for p in out.glob("model-*.safetensors"))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n")


def required_files(cfg: dict) -> tuple[str, ...]:
    return ("config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
            "tokenizer_config.json", demo_model.TIKTOKEN_FILE_NAME, *shards(cfg))


def make_shaped_model(out_dir: Path, *, shape: str = "gpt-oss-120b", layers: int = 2, seed: int = 0) -> Path:
    """Write the checkpoint to out_dir (reused if it already holds this one) and return out_dir."""
    values = config_values(shape, layers)
    marker = demo_model._marker(seed, "mxfp4", shape=shape, layers=layers) | {"version": SHAPES_VERSION}

    def write(tmp: Path) -> None:
        demo_model._write_tokenizer(install_tiktoken_file(tmp), tmp)
        _write_weights(tmp, values, seed)

    return demo_model.build_model_dir(out_dir, marker, required_files(values), write)
