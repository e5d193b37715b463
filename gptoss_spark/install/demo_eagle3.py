"""A tiny random-weight Eagle3 draft head for the demo gpt-oss, so a real vLLM speculates on a CPU.

The Spark profiles that speculate (spec, auto) load NVIDIA's gpt-oss-120b Eagle3
head: one Llama decoder layer over the target's hidden states, architecture
`LlamaForCausalLMEagle3`. This writes the same architecture at the demo model's
size (hidden 64), with random weights, for the demo checkpoint
(demo_model.CONFIG_VALUES): vLLM 0.32.0 loads it (model_executor/models/
llama_eagle3.py), drafts with it and verifies the drafts, so the speculation
counters (`vllm:spec_decode_*` on /metrics) move as they do on a Spark. Its
drafts are noise: acceptance is near zero, which tests must not read as a fault.

Tensor names are the published heads' (`midlayer.*`, `fc`, `norm`, `lm_head`);
vLLM maps `midlayer.` to `layers.0.` and stacks q/k/v and gate/up itself. No
`embed_tokens`: vLLM then shares the target's embedding, as for NVIDIA's head.
"""

from __future__ import annotations

import json
from pathlib import Path

from .demo_model import CONFIG_VALUES, INIT_STD

# The demo target has 2 layers; vLLM's gpt-oss forward records the hidden state after
# "layer" 0 (the embeddings), 1 and 2, so [0, 1, 2] gives three states like the real
# head's three (fc input = 3 x hidden).
AUX_LAYER_IDS = [0, 1, 2]


def head_config() -> dict:
    hidden = CONFIG_VALUES["hidden_size"]
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "torch_dtype": "bfloat16",
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 1,
        "num_attention_heads": CONFIG_VALUES["num_attention_heads"],
        "num_key_value_heads": CONFIG_VALUES["num_key_value_heads"], "head_dim": CONFIG_VALUES["head_dim"],
        "vocab_size": CONFIG_VALUES["vocab_size"], "draft_vocab_size": CONFIG_VALUES["vocab_size"],
        "rms_norm_eps": 1e-05, "max_position_embeddings": CONFIG_VALUES["max_position_embeddings"],
        "rope_theta": 150000.0, "tie_word_embeddings": False,
        "eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS,
    }


def make_demo_eagle3_head(out_dir: Path, *, seed: int = 0) -> Path:
    """Write config.json + model.safetensors of the tiny head into out_dir (created); returns out_dir."""
    import torch
    from safetensors.torch import save_file

    cfg = head_config()
    h, heads, kv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inter, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    shapes = {
        # The Eagle3 layer's attention reads [input embedding, fc(hidden states)]: 2 x hidden wide.
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * hd),
        "midlayer.mlp.gate_proj.weight": (inter, h),
        "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "fc.weight": (h, len(AUX_LAYER_IDS) * h),
        "lm_head.weight": (vocab, h),
    }
    gen = torch.Generator().manual_seed(seed)
    tensors = {name: (torch.randn(shape, generator=gen) * INIT_STD).to(torch.bfloat16)
               for name, shape in shapes.items()}
    for norm in ("midlayer.input_layernorm", "midlayer.hidden_norm", "midlayer.post_attention_layernorm", "norm"):
        tensors[f"{norm}.weight"] = torch.ones(h, dtype=torch.bfloat16)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out_dir
