"""The kernels as torch custom ops, so torch.compile treats them as opaque calls and CUDA graphs capture them.

  torch.ops.gptoss_spark.moe_decode(x, router_w, router_b, w13, s13, b13, w2, s2, b2, top_k) -> [M, H] bf16
  torch.ops.gptoss_spark.router_logits(x, router_w, router_b) -> [M, E] fp32   (one launch, M<=32)

Importing this module registers them (the vLLM plugin does so in every process).
"""

from __future__ import annotations

import torch

from .moe import fused_moe_decode
from .router_logits import router_logits_partial

LIB = "gptoss_spark"


@torch.library.custom_op(f"{LIB}::moe_decode", mutates_args=(), device_types="cuda")
def moe_decode(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None,
               w13: torch.Tensor, s13: torch.Tensor, b13: torch.Tensor | None,
               w2: torch.Tensor, s2: torch.Tensor, b2: torch.Tensor | None, top_k: int) -> torch.Tensor:
    return fused_moe_decode(x, router_w, router_b, w13, s13, b13, w2, s2, b2, top_k)


@moe_decode.register_fake
def _moe_decode_fake(x, router_w, router_b, w13, s13, b13, w2, s2, b2, top_k):
    return torch.empty_like(x)


@torch.library.custom_op(f"{LIB}::router_logits", mutates_args=(), device_types="cuda")
def router_logits(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None) -> torch.Tensor:
    return router_logits_partial(x.contiguous(), router_w, router_b, split_k=1)[0]


@router_logits.register_fake
def _router_logits_fake(x, router_w, router_b):
    return x.new_empty((x.shape[0], router_w.shape[0]), dtype=torch.float32)
