"""The kernels as torch custom ops, so torch.compile treats them as opaque calls and CUDA graphs capture them.

  torch.ops.gptoss_spark.moe_decode(x, router_w, router_b, w13, s13, b13, w2, s2, b2, top_k) -> [M, H] bf16
  torch.ops.gptoss_spark.router_logits(x, router_w, router_b) -> [M, E] fp32   (one launch, M<=32)
  torch.ops.gptoss_spark.moe_block(...same as moe_decode...) -> [M, H] bf16      (any M)

moe_block is what the vLLM plugin calls: up to DECODE_DISPATCH_TOKENS (16) tokens the
decode kernels, more the prefill kernels (moe_prefill.py), which from 17 tokens are
faster (measured on the H200 in both layouts, docs/KERNELS.md "Prefill").
The token-count dispatch happens inside the op, so torch.compile never traces
a branch on the batch size.

Importing this module registers them (the vLLM plugin does so in every process):
for CUDA tensors, and under TRITON_INTERPRET=1 for CPU tensors too (Triton's
interpreter runs the kernels there; CI serves a model through them so).
"""

from __future__ import annotations

import logging

import torch

from .device.moe_prefill import moe_prefill_block
from .device.router_logits import router_logits_partial
from .moe import fused_moe_decode, layout_version
from .mxfp4_layout import SwizzledExperts
from .runtime import interpreting

LIB = "gptoss_spark"
# Past this many tokens the prefill kernels beat the decode kernels (which take up to 32):
# H200, layout 3: 16 tokens 255 vs 343 us per layer, 20 tokens 443 vs 389; layout 2: 269 vs 311, then
# 528 vs 350 (benchmarks/kernels/sweep_prefill.py).
DECODE_DISPATCH_TOKENS = 16
# Without the interpreter Triton cannot launch on a CPU tensor: no CPU kernel is registered then.
DEVICE_TYPES = ("cuda", "cpu") if interpreting() else "cuda"
# moe_block_any's calls per path in this process, the first of each logged (the vLLM plugin shows
# this package's log in the engine's). Python runs at eager calls and CUDA-graph captures, not at
# graph replays.
CALLS = {"decode": 0, "prefill": 0}
log = logging.getLogger(__name__)


def _ran(path: str, m: int) -> None:
    CALLS[path] += 1
    if CALLS[path] == 1:
        log.info("gptoss-spark MoE kernels: %s path ran (first call: %d tokens)", path, m)


def _swizzled(w13, s13, b13, w2, s2, b2) -> SwizzledExperts:
    """An op's six expert tensors (torch.library takes tensors, not objects) as the launchers take them,
    in the layout version they were repacked with on this device (the vLLM plugin's repack_layer)."""
    return SwizzledExperts(w13, s13, b13, w2, s2, b2, mma=layout_version(w13.device))


@torch.library.custom_op(f"{LIB}::moe_decode", mutates_args=(), device_types=DEVICE_TYPES)
def moe_decode(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None,
               w13: torch.Tensor, s13: torch.Tensor, b13: torch.Tensor | None,
               w2: torch.Tensor, s2: torch.Tensor, b2: torch.Tensor | None, top_k: int) -> torch.Tensor:
    return fused_moe_decode(x, router_w, router_b, _swizzled(w13, s13, b13, w2, s2, b2), top_k)


@moe_decode.register_fake
def _moe_decode_fake(x, router_w, router_b, w13, s13, b13, w2, s2, b2, top_k):
    return torch.empty_like(x)


@torch.library.custom_op(f"{LIB}::router_logits", mutates_args=(), device_types=DEVICE_TYPES)
def router_logits(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None) -> torch.Tensor:
    return router_logits_partial(x.contiguous(), router_w, router_b, split_k=1)[0]


@router_logits.register_fake
def _router_logits_fake(x, router_w, router_b):
    return x.new_empty((x.shape[0], router_w.shape[0]), dtype=torch.float32)


def moe_block_any(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None,
                  experts: SwizzledExperts, top_k: int) -> torch.Tensor:
    """Any number of tokens: up to DECODE_DISPATCH_TOKENS the decode kernels, more the prefill kernels,
    which read each expert once per block of its (token, k) pairs (moe_prefill.prefill_config_for)
    rather than run every token against every routed expert (docs/KERNELS.md, "Prefill")."""
    if x.shape[0] <= DECODE_DISPATCH_TOKENS:
        _ran("decode", x.shape[0])
        return fused_moe_decode(x, router_w, router_b, experts, top_k)
    _ran("prefill", x.shape[0])
    return moe_prefill_block(x, router_w, router_b, experts, top_k)


@torch.library.custom_op(f"{LIB}::moe_block", mutates_args=(), device_types=DEVICE_TYPES)
def moe_block(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None,
              w13: torch.Tensor, s13: torch.Tensor, b13: torch.Tensor | None,
              w2: torch.Tensor, s2: torch.Tensor, b2: torch.Tensor | None, top_k: int) -> torch.Tensor:
    return moe_block_any(x, router_w, router_b, _swizzled(w13, s13, b13, w2, s2, b2), top_k)


@moe_block.register_fake
def _moe_block_fake(x, router_w, router_b, w13, s13, b13, w2, s2, b2, top_k):
    return torch.empty_like(x)
