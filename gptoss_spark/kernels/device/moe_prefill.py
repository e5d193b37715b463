"""Prefill MoE (any number of tokens) on the decode kernels' weight layout: tokens grouped by expert.

The decode kernels give each expert's program every token of the call (at
most 32) and mask the ones not routed to it; for a prefill chunk that would
read each touched expert once per 32 tokens. Here the (token, k) pairs are
sorted by expert into blocks of BLOCK_M pairs (prefill_routing.align: no host
sync, static shapes so a CUDA graph can hold it), and program (row block,
pair block) reads its expert's row block once for BLOCK_M pairs:

  1. moe_prefill_gate_up_kernel  x rows of the block's tokens @ gate/up^T,
                                 bias, SwiGLU -> h [pairs, I] (bf16)
  2. moe_prefill_down_kernel     h @ down^T + bias, times the pair's routing
                                 weight -> y [pairs, H] (fp32)
  3. y summed over each token's top-k pairs (prefill_routing.combine; a fixed order: deterministic)

The routing (moe_prefill_block) is prefill_routing.route: logits in fp32 from the bf16
inputs, top-k, softmax over the selected, the reference's math. Both kernels
reuse the decode kernels' loops (moe_gate_up.gate_up_dot,
mxfp4_decode.mxfp4_rows_dot): the pair block is the tensor-core tile's token
columns. ops.moe_block sends every call of more than ops.DECODE_DISPATCH_TOKENS
(16) tokens here (docs/KERNELS.md, "Prefill").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..mxfp4_layout import SwizzledExperts
from ..runtime import interpreting
from .moe_gate_up import SWIGLU_ALPHA, SWIGLU_LIMIT, gate_up_dot, swiglu
from .mxfp4_decode import mxfp4_rows_dot
from .prefill_routing import align, combine, counts_of, route


@dataclass(frozen=True)
class PrefillConfig:
    """Tiles of the prefill kernels. prefill_config_for picks one per token count and layout."""
    block_m: int = 32   # (token, k) pairs per program: the tensor-core tile's token columns
    gate_up_c: int = 1  # 64-k blocks per loop iteration
    down_c: int = 1
    stages: int = 3


DEFAULT_PREFILL = PrefillConfig()

# The pair block by token count, per layout: (up to this many tokens, block_m), measured on the H200
# (benchmarks/kernels/sweep_prefill.py; docs/KERNELS.md "Prefill"). A block should hold about the pairs
# one expert gets: fewer padding columns of MMA when experts get 1-4 pairs each (32-128 tokens), and
# from ~16 pairs per expert a larger block reads each expert's weights fewer times. Layout 3 (wgmma)
# has no 8-column tile: block_m 8 computes wrong sums there (measured), so its smallest block is 16.
PREFILL_BLOCKS = {
    2: ((128, 8), (512, 16), (1024, 32), (None, 64)),
    3: ((256, 16), (512, 32), (None, 64)),
}
# Blocks of up to 16 pairs take 2 k-blocks per loop iteration (5-8 % faster on both layouts at 32-512
# tokens); 32 and 64 keep 1, which on GB10 holds 3-4 programs per SM where 2 would hold 2 (shared memory).
WIDE_LOOP_MAX_BLOCK_M = 16


def prefill_config_for(tokens: int, mma: int) -> PrefillConfig:
    """The tiles moe_prefill uses for a chunk of `tokens` tokens on layout `mma`."""
    block_m = next(b for limit, b in PREFILL_BLOCKS[mma] if limit is None or tokens <= limit)
    c = 2 if block_m <= WIDE_LOOP_MAX_BLOCK_M else 1
    return PrefillConfig(block_m=block_m, gate_up_c=c, down_c=c)


def prefill_configs(mma: int) -> list[PrefillConfig]:
    """Every config prefill_config_for can return on layout mma (the AOT build compiles each)."""
    return list(dict.fromkeys(prefill_config_for(limit or 1 << 20, mma) for limit, _ in PREFILL_BLOCKS[mma]))


def check_config(config: PrefillConfig, mma: int) -> None:
    if mma == 3 and config.block_m < 16:
        raise ValueError(f"prefill block_m {config.block_m}: layout 3 (wgmma) needs at least 16 pairs per block")


PREFILL_WARPS = 4  # one warpgroup: 64 weight rows per tile (mxfp4_layout.py)


@triton.jit
def _pairs_of_block(pairs_ptr, blk, N_PAIRS, BLOCK_M: tl.constexpr):
    """-> (the block's pairs as int64, which are real): padding becomes pair 0, a valid address; its
    columns are neither read (the kernels mask them: unmasked, every padding column reads the same
    row, an L2 hot spot) nor stored."""
    pair = tl.load(pairs_ptr + blk * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < N_PAIRS
    return tl.where(valid, pair, 0).to(tl.int64), valid


# N_PAIRS (M x top-k) is not specialized on its value: one binary serves every prefill length, so the
# AOT build's one launch covers them all (Triton would otherwise compile again for multiples of 16).
@triton.jit(do_not_specialize=["N_PAIRS"])
def moe_prefill_gate_up_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, h_ptr, pairs_ptr, block_expert_ptr,
    N_PAIRS, stride_xm,
    H: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, BLOCK_M: tl.constexpr, C: tl.constexpr,
    MMA: tl.constexpr, HAS_BIAS: tl.constexpr, DECODE: tl.constexpr, INTERPRET: tl.constexpr,
    ALPHA: tl.constexpr = SWIGLU_ALPHA, LIMIT: tl.constexpr = SWIGLU_LIMIT,
):
    KB: tl.constexpr = H // 64
    RB: tl.constexpr = I // 64
    pid_b = tl.program_id(0)
    expert = tl.load(block_expert_ptr + tl.program_id(1))
    if expert >= 0:
        pair, valid = _pairs_of_block(pairs_ptr, tl.program_id(1), N_PAIRS, BLOCK_M)
        x_rows = x_ptr + (pair // TOPK) * stride_xm
        gate_blk = expert.to(tl.int64) * (2 * RB * KB) + pid_b * KB
        acc_gate = tl.zeros((64, BLOCK_M), dtype=tl.float32)
        acc_up = tl.zeros((64, BLOCK_M), dtype=tl.float32)
        acc_gate, acc_up = gate_up_dot(w_ptr, s_ptr, gate_blk, gate_blk + RB * KB, x_rows, valid, 0, KB,
                                       acc_gate, acc_up, C, MMA, DECODE, INTERPRET, True, 0, 0)
        h = swiglu(acc_gate, acc_up, b_ptr, expert, pid_b, I, HAS_BIAS, ALPHA, LIMIT, 64)
        offs_i = pid_b * 64 + tl.arange(0, 64)
        tl.store(h_ptr + pair[None, :] * I + offs_i[:, None], h.to(tl.bfloat16), mask=valid[None, :])


@triton.jit(do_not_specialize=["N_PAIRS"])
def moe_prefill_down_kernel(
    h_ptr, pairs_ptr, block_expert_ptr, route_weights_ptr, w_ptr, s_ptr, b_ptr, y_ptr,
    N_PAIRS,
    H: tl.constexpr, I: tl.constexpr, BLOCK_M: tl.constexpr, C: tl.constexpr, MMA: tl.constexpr,
    HAS_BIAS: tl.constexpr, DECODE: tl.constexpr, INTERPRET: tl.constexpr,
):
    KB: tl.constexpr = I // 64
    RB: tl.constexpr = H // 64
    pid_n = tl.program_id(0)
    expert = tl.load(block_expert_ptr + tl.program_id(1))
    if expert >= 0:
        pair, valid = _pairs_of_block(pairs_ptr, tl.program_id(1), N_PAIRS, BLOCK_M)
        acc = tl.zeros((64, BLOCK_M), dtype=tl.float32)
        acc = mxfp4_rows_dot(w_ptr, s_ptr, (expert.to(tl.int64) * RB + pid_n) * KB, h_ptr + pair * I, valid, 0, KB,
                             KB // C * C, False, acc, C, MMA, DECODE, INTERPRET, True)
        offs_n = pid_n * 64 + tl.arange(0, 64)
        if HAS_BIAS:
            acc += tl.load(b_ptr + expert * H + offs_n).to(tl.float32)[:, None]
        acc *= tl.load(route_weights_ptr + pair)[None, :]
        tl.store(y_ptr + pair[None, :] * H + offs_n[:, None], acc, mask=valid[None, :])


def launch_kwargs(config: PrefillConfig, h: int, i: int, top_k: int, gate_up_bias: bool, down_bias: bool, mma: int,
                  decode: int, interpret: bool) -> tuple[dict, dict]:
    """The constexprs and launch options of (gate_up, down): moe_prefill launches with them and
    aot.compile_prefill_variants compiles them."""
    common = dict(H=h, I=i, BLOCK_M=config.block_m, MMA=mma, DECODE=decode, INTERPRET=interpret,
                  num_warps=PREFILL_WARPS, num_stages=config.stages)
    return (dict(common, TOPK=top_k, C=config.gate_up_c, HAS_BIAS=gate_up_bias),
            dict(common, C=config.down_c, HAS_BIAS=down_bias))


def moe_prefill(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts: SwizzledExperts,
                config: PrefillConfig | None = None, counts: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, H] bf16 routed by ids / weights [M, K] -> [M, H] bf16. config None: prefill_config_for(M,
    the experts' layout version). counts: pairs per expert (prefill_routing.route returns them; None
    counts them here)."""
    m, h = x.shape
    mma = experts.mma
    config = prefill_config_for(m, mma) if config is None else config
    check_config(config, mma)
    top_k = ids.shape[1]
    w13, s13, b13, w2, s2, b2 = experts.tensors()
    e = w13.shape[0]
    i = experts.intermediate
    x = x.contiguous()
    dev = x.device
    interp = interpreting()
    decode = 1 if interp else 2  # (the PTX decode does not run in the interpreter)
    n_pairs = m * top_k
    pairs, block_expert = align(ids, counts_of(ids, e) if counts is None else counts, config.block_m)
    n_blocks = block_expert.numel()
    dummy = x  # stands in for absent biases; never read
    hs = torch.empty((n_pairs, i), dtype=torch.bfloat16, device=dev)
    gate_up_kw, down_kw = launch_kwargs(config, h, i, top_k, b13 is not None, b2 is not None, mma, decode, interp)
    moe_prefill_gate_up_kernel[(i // 64, n_blocks)](
        x, w13, s13, b13 if b13 is not None else dummy, hs, pairs, block_expert, n_pairs, x.stride(0), **gate_up_kw)
    y = torch.empty((n_pairs, h), dtype=torch.float32, device=dev)
    moe_prefill_down_kernel[(h // 64, n_blocks)](
        hs, pairs, block_expert, weights.to(torch.float32).contiguous(), w2, s2, b2 if b2 is not None else dummy,
        y, n_pairs, **down_kw)
    return combine(y, m, top_k)


def moe_prefill_block(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None,
                      experts: SwizzledExperts, top_k: int, config: PrefillConfig | None = None) -> torch.Tensor:
    """The whole MoE block for a prefill chunk: prefill_routing.route, then moe_prefill.

    The routing is the decode router's math (fp32 logits from the bf16 inputs, top-k with ties to
    the lower expert), so a prompt's tokens pick the experts its decode steps would. A kernel of
    its own rather than the decode router: that one's tile holds at most 32 tokens.
    """
    ids, weights, counts = route(x, router_w, router_b, top_k)
    return moe_prefill(x, ids, weights, experts, config=config, counts=counts)
