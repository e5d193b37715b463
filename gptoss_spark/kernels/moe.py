"""Host side of the fused decode MoE: shapes, launch configs, and the three launches per layer.

  1. router_logits_kernel  x @ Wr^T as K-split partials; its last program
                           does top-k + softmax and lists the experts    (router_logits.py, routing.py)
  2. moe_gate_up_kernel    gate_up, bias, SwiGLU -> h                     (moe_gate_up.py)
  3. moe_down_kernel       down, bias, routing-weighted sum -> y; with a
                           split, each row block's last program adds the
                           partials                                       (moe_down.py)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .moe_down import moe_down_kernel
from .moe_gate_up import moe_gate_up_kernel
from .mxfp4_layout import BLOCK_BYTES, SCALE_BLOCK_BYTES, mma_layout_for
from .runtime import interpreting
from .router_logits import m_pad_for, router_logits_partial

MAX_DECODE_TOKENS = 32


@dataclass(frozen=True)
class MoeLaunchConfig:
    """Tile sizes; DEFAULT is what the H200 sweep picked (benchmarks/kernels/results/).

    The expert kernels always use 4 warps (one warpgroup: 64 weight rows per
    tensor-core tile, the layout of mxfp4_layout.py); *_c is how many 64-k
    blocks one loop iteration takes.
    """
    router_split_k: int = 9
    router_block_e: int = 16
    router_block_k: int = 64
    gate_up_c: int = 4
    gate_up_stages: int = 3
    down_c: int = 4
    down_stages: int = 3
    down_split: int = 8  # >1: work split over programs, partials added by each row block's last program
    # mxfp4_decode.py: 1 portable (interpreter), 2 inline PTX (GPU only)
    decode: int = 2


EXPERT_WARPS = 4

DEFAULT_CONFIG = MoeLaunchConfig()


_COUNTERS: dict[torch.device, torch.Tensor] = {}
ROUTER_COUNTER = 0      # the router kernel's arrival counter
DOWN_COUNTERS = 1       # then one per down row block (H / 64 <= 127)
N_COUNTERS = 128


def _counters(device: torch.device) -> torch.Tensor:
    """The kernels' arrival counters: zero between calls (each last program resets its own).

    One buffer per device, allocated at the first (eager, warm-up) call so that
    CUDA graphs captured later use the same memory. Layers run one after another
    on one stream, so one set serves them all.
    """
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros((N_COUNTERS,), dtype=torch.int32, device=device)
    return _COUNTERS[device]


_LAYOUTS: dict[torch.device, int] = {}


def _layout_version(device: torch.device) -> int:
    """The layout version the experts were repacked with on this device (fixed per process)."""
    if device not in _LAYOUTS:
        _LAYOUTS[device] = mma_layout_for(device)
    return _LAYOUTS[device]


def check_shapes(x, router_w, w13, s13, w2, s2, top_k: int) -> tuple[int, int, int, int]:
    """Shapes of the kernels' layout (mxfp4_layout.SwizzledExperts) -> (M, H, E, I)."""
    m, h = x.shape
    e = router_w.shape[0]
    if not 1 <= m <= MAX_DECODE_TOKENS:
        raise ValueError(f"fused decode MoE takes 1..{MAX_DECODE_TOKENS} tokens, got {m}")
    i = w13.shape[1] * 32
    if (w13.shape != (e, 2 * i // 64, h // 64, BLOCK_BYTES) or s13.shape != (e, 2 * i // 64, h // 64, SCALE_BLOCK_BYTES)
            or w2.shape != (e, h // 64, i // 64, BLOCK_BYTES) or s2.shape != (e, h // 64, i // 64, SCALE_BLOCK_BYTES)):
        raise ValueError(f"expert tensors {tuple(w13.shape)}/{tuple(s13.shape)}/{tuple(w2.shape)}/{tuple(s2.shape)} "
                         f"are not the kernels' layout for E={e} H={h} (repack with mxfp4_layout.SwizzledExperts)")
    if h // 64 > N_COUNTERS - DOWN_COUNTERS:
        raise ValueError(f"hidden size {h}: at most {64 * (N_COUNTERS - DOWN_COUNTERS)} supported")
    if top_k not in (1, 2, 4, 8) or top_k > e:
        raise ValueError(f"top_k must be a power of two <= {e}, got {top_k}")
    return m, h, e, i


def fused_moe_decode(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None,
                     w13: torch.Tensor, s13: torch.Tensor, b13: torch.Tensor | None,
                     w2: torch.Tensor, s2: torch.Tensor, b2: torch.Tensor | None,
                     top_k: int, config: MoeLaunchConfig = DEFAULT_CONFIG,
                     return_routing: bool = False, mma: int | None = None, launches: int = 3):
    """gpt-oss MoE block for 1..32 decode tokens: x [M, H] bf16 -> [M, H] bf16 (see reference.moe_block_ref).

    Experts in the kernels' layout: w13/s13/b13/w2/s2/b2 as in mxfp4_layout.SwizzledExperts,
    repacked for this device's layout version (mma_layout_for; `mma` overrides it, for tests).
    launches < 3 stops after the router (1) or gate_up (2) and returns None: the benchmark
    times the stages so.
    """
    m, h, e, i = check_shapes(x, router_w, w13, s13, w2, s2, top_k)
    x = x.contiguous()
    dev = x.device
    m_pad = m_pad_for(m)
    cfg = config
    interp = interpreting()
    decode = 1 if interp else cfg.decode  # no PTX in the interpreter
    mma = _layout_version(dev) if mma is None else mma
    h_buf = torch.empty((m, top_k, i), dtype=torch.bfloat16, device=dev)
    ids = torch.empty((m, top_k), dtype=torch.int32, device=dev)
    weights = torch.empty((m, top_k), dtype=torch.float32, device=dev)
    experts = torch.empty((e,), dtype=torch.int32, device=dev)
    n_experts = torch.empty((1,), dtype=torch.int32, device=dev)
    router_logits_partial(x, router_w, router_b, split_k=cfg.router_split_k, block_e=cfg.router_block_e,
                          block_k=cfg.router_block_k,
                          routing=(ids, weights, experts, n_experts, _counters(dev)[ROUTER_COUNTER:]),
                          top_k=top_k)
    if launches < 2:
        return None
    dummy = x  # stands in for absent biases; never read (HAS_*BIAS=False)
    moe_gate_up_kernel[(i // 64, min(e, m * top_k))](
        x, w13, s13, b13 if b13 is not None else dummy,
        h_buf, ids, experts, n_experts,
        m, x.stride(0), H=h, I=i,
        TOPK=top_k, M_PAD=m_pad, C=cfg.gate_up_c, MMA=mma, HAS_BIAS=b13 is not None, DECODE=decode, INTERPRET=interp,
        num_warps=EXPERT_WARPS, num_stages=cfg.gate_up_stages)
    if launches < 3:
        return None
    out = torch.empty((m, h), dtype=torch.bfloat16, device=dev)
    split = cfg.down_split
    partial_out = torch.empty((split, m, h), dtype=torch.float32, device=dev) if split > 1 else out
    moe_down_kernel[(h // 64, split)](
        h_buf, ids, weights, experts, n_experts,
        w2, s2, b2 if b2 is not None else dummy, out, partial_out, _counters(dev)[DOWN_COUNTERS:],
        m, out.stride(0), H=h, I=i,
        TOPK=top_k, M_PAD=m_pad, C=cfg.down_c, MMA=mma, HAS_BIAS=b2 is not None,
        DECODE=decode, INTERPRET=interp, SPLIT=split, num_warps=EXPERT_WARPS, num_stages=cfg.down_stages)
    if return_routing:
        return out, ids, weights
    return out
