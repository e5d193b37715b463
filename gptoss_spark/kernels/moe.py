"""Host side of the fused decode MoE: shapes, launch configs, and the three launches per layer.

  1. router_logits_kernel  x @ Wr^T as K-split partials; its last program
                           does top-k + softmax and lists the experts    (router_logits.py, routing.py)
  2. moe_gate_up_kernel    gate_up, bias, SwiGLU -> h                     (moe_gate_up.py)
  3. moe_down_kernel       down, bias, routing-weighted sum -> y         (moe_down.py)
  4. moe_combine_kernel    only with down_split > 1: adds the partials   (moe_combine.py)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .moe_combine import moe_combine_kernel
from .moe_down import moe_down_kernel
from .moe_gate_up import moe_gate_up_kernel
from .runtime import interpreting
from .router_logits import m_pad_for, router_logits_partial

MAX_DECODE_TOKENS = 32


@dataclass(frozen=True)
class MoeLaunchConfig:
    """Tile sizes; DEFAULT is what the H200 sweep picked (benchmarks/kernels/results/)."""
    router_split_k: int = 9
    router_block_e: int = 16
    router_block_k: int = 64
    gate_up_block_i: int = 64
    gate_up_block_k: int = 128
    gate_up_warps: int = 4
    gate_up_stages: int = 3
    down_block_n: int = 32
    down_block_k: int = 512
    down_warps: int = 4
    down_stages: int = 3
    down_split: int = 8  # >1: experts split over programs, partials added by moe_combine_kernel
    # mxfp4_decode.py: 0 tl.dot_scaled, 1 portable bit trick, 2 inline PTX (GPU only)
    decode: int = 2


DEFAULT_CONFIG = MoeLaunchConfig()


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counter(device: torch.device) -> torch.Tensor:
    """The router kernel's arrival counter: zero between calls (its last program resets it).

    One per device, allocated at the first (eager, warm-up) call so that CUDA
    graphs captured later use the same buffer. Layers run one after another on
    one stream, so one counter serves them all.
    """
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros((1,), dtype=torch.int32, device=device)
    return _COUNTERS[device]


def _packed(w: torch.Tensor) -> torch.Tensor:
    """Checkpoint blocks [E, N, K/32, 16] -> [E, N, K/2] (a view, no copy)."""
    return w.flatten(-2) if w.dim() == 4 else w


def check_shapes(x, router_w, w13, s13, w2, s2, top_k: int) -> tuple[int, int, int, int]:
    m, h = x.shape
    e = router_w.shape[0]
    i = w2.shape[2] * 2
    if not 1 <= m <= MAX_DECODE_TOKENS:
        raise ValueError(f"fused decode MoE takes 1..{MAX_DECODE_TOKENS} tokens, got {m}")
    if w13.shape != (e, 2 * i, h // 2) or s13.shape != (e, 2 * i, h // 32):
        raise ValueError(f"w13/s13 shapes {tuple(w13.shape)}/{tuple(s13.shape)} do not match E={e} H={h} I={i}")
    if w2.shape != (e, h, i // 2) or s2.shape != (e, h, i // 32):
        raise ValueError(f"w2/s2 shapes {tuple(w2.shape)}/{tuple(s2.shape)} do not match E={e} H={h} I={i}")
    if h % 32 or i % 32:
        raise ValueError("hidden and intermediate sizes must be multiples of 32 (MXFP4 blocks)")
    if top_k not in (1, 2, 4, 8) or top_k > e:
        raise ValueError(f"top_k must be a power of two <= {e}, got {top_k}")
    return m, h, e, i


def fused_moe_decode(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None,
                     w13: torch.Tensor, s13: torch.Tensor, b13: torch.Tensor | None,
                     w2: torch.Tensor, s2: torch.Tensor, b2: torch.Tensor | None,
                     top_k: int, config: MoeLaunchConfig = DEFAULT_CONFIG,
                     return_routing: bool = False):
    """gpt-oss MoE block for 1..32 decode tokens: x [M, H] bf16 -> [M, H] bf16 (see reference.moe_block_ref)."""
    w13, w2 = _packed(w13), _packed(w2)
    m, h, e, i = check_shapes(x, router_w, w13, s13, w2, s2, top_k)
    x = x.contiguous()
    dev = x.device
    m_pad = m_pad_for(m)
    cfg = config
    interp = interpreting()
    decode = 1 if interp and cfg.decode == 2 else cfg.decode  # no PTX in the interpreter
    h_buf = torch.empty((m, top_k, i), dtype=torch.bfloat16, device=dev)
    ids = torch.empty((m, top_k), dtype=torch.int32, device=dev)
    weights = torch.empty((m, top_k), dtype=torch.float32, device=dev)
    experts = torch.empty((e,), dtype=torch.int32, device=dev)
    n_experts = torch.empty((1,), dtype=torch.int32, device=dev)
    router_logits_partial(x, router_w, router_b, split_k=cfg.router_split_k, block_e=cfg.router_block_e,
                          block_k=cfg.router_block_k, routing=(ids, weights, experts, n_experts, _counter(dev)),
                          top_k=top_k)
    dummy = x  # stands in for absent biases; never read (HAS_*BIAS=False)
    grid = (triton.cdiv(i, cfg.gate_up_block_i), min(e, m * top_k))
    moe_gate_up_kernel[grid](
        x,
        w13, s13, b13 if b13 is not None else dummy,
        h_buf, ids, experts, n_experts,
        m, e, h, i,
        x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1),
        b13.stride(0) if b13 is not None else 0,
        TOPK=top_k, M_PAD=m_pad, BLOCK_I=cfg.gate_up_block_i, BLOCK_K=cfg.gate_up_block_k,
        HAS_BIAS=b13 is not None, DECODE=decode, INTERPRET=interp,
        num_warps=cfg.gate_up_warps, num_stages=cfg.gate_up_stages)
    out = torch.empty((m, h), dtype=torch.bfloat16, device=dev)
    split = cfg.down_split
    partial_out = torch.empty((split, m, h), dtype=torch.float32, device=dev) if split > 1 else out
    moe_down_kernel[(triton.cdiv(h, cfg.down_block_n), split)](
        h_buf, ids, weights, experts, n_experts,
        w2, s2, b2 if b2 is not None else dummy, out, partial_out,
        m, h, i,
        w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), b2.stride(0) if b2 is not None else 0, out.stride(0),
        TOPK=top_k, M_PAD=m_pad, BLOCK_N=cfg.down_block_n, BLOCK_K=cfg.down_block_k, HAS_BIAS=b2 is not None,
        DECODE=decode, INTERPRET=interp, SPLIT=split, num_warps=cfg.down_warps, num_stages=cfg.down_stages)
    if split > 1:
        block = 1024
        moe_combine_kernel[(triton.cdiv(m * h, block),)](partial_out, out, m, h, out.stride(0),
                                                         SPLIT=split, BLOCK=block, num_warps=4)
    if return_routing:
        return out, ids, weights
    return out
