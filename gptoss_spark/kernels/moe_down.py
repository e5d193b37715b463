"""Fused decode MoE, stage 2 of 2: down GEMM on MXFP4 weights + bias + routing-weighted combine.

Grid (H / 64 row blocks, SPLIT). Program (n, p) loops over the distinct
experts p, p + SPLIT, ... that the router published and sums
weight_k * (h_k @ W2_e^T + b2_e) for its 64 rows in fp32 registers. SPLIT = 1
writes bf16 out directly. SPLIT > 1 writes fp32 partials [SPLIT, M, H]; the
last of a row block's SPLIT programs to finish (an arrival counter per row
block, as in the router kernel) adds them in a fixed order and writes bf16:
deterministic, no zeroed buffer, no extra launch. The split exists because
H / 64 alone is 45 programs, too few to keep enough bytes in flight.

h rows are read without masks: a token not routed to the expert reads its
slot-0 row (written by stage 1, finite) and is weighted 0; padding columns
point at token 0 and are never stored.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .arrival import last_to_arrive, reset_arrivals
from .mxfp4_decode import mxfp4_block_dot
from .routing import tokens_of_expert


@triton.jit(do_not_specialize=["M"])
def moe_down_kernel(
    h_ptr, ids_ptr, weights_ptr, experts_ptr, n_experts_ptr,
    w_ptr, s_ptr, b_ptr, out_ptr, partial_ptr, counter_ptr,
    M, stride_om,
    H: tl.constexpr, I: tl.constexpr,
    TOPK: tl.constexpr, M_PAD: tl.constexpr, C: tl.constexpr, MMA: tl.constexpr, HAS_BIAS: tl.constexpr,
    DECODE: tl.constexpr, INTERPRET: tl.constexpr, SPLIT: tl.constexpr = 1,
):
    KB: tl.constexpr = I // 64
    RB: tl.constexpr = H // 64
    pid_n = tl.program_id(0)
    pid_split = tl.program_id(1)
    offs_m = tl.arange(0, M_PAD)
    offs_t = tl.arange(0, TOPK)
    offs_n = pid_n * 64 + tl.arange(0, 64)
    offs_k = tl.arange(0, C * 64)
    row_ok = (offs_m < M)[:, None]
    ids = tl.load(ids_ptr + offs_m[:, None] * TOPK + offs_t[None, :], mask=row_ok, other=-1)
    weights = tl.load(weights_ptr + offs_m[:, None] * TOPK + offs_t[None, :], mask=row_ok, other=0.0)
    token = tl.where(offs_m < M, offs_m, 0)
    n_experts = tl.load(n_experts_ptr)
    out = tl.zeros((64, M_PAD), dtype=tl.float32)
    for s in range(pid_split, n_experts, SPLIT):
        expert = tl.load(experts_ptr + s).to(tl.int64)
        routed, token_slot = tokens_of_expert(ids, expert.to(tl.int32), M, M_PAD, TOPK)
        token_weight = tl.sum(tl.where(offs_t[None, :] == token_slot[:, None], weights, 0.0), axis=1)
        token_weight = tl.where(routed, token_weight, 0.0)
        h_rows = h_ptr + (token * TOPK + token_slot) * I
        blk = (expert * RB + pid_n) * KB
        acc = tl.zeros((64, M_PAD), dtype=tl.float32)
        for c0 in range(0, KB - KB % C, C):
            ht = tl.load(h_rows[None, :] + (c0 * 64 + offs_k)[:, None])
            acc = mxfp4_block_dot(w_ptr + (blk + c0) * 2048, s_ptr + (blk + c0) * 128, ht, acc,
                                  C, MMA, DECODE, INTERPRET)
        for c0 in tl.static_range(KB - KB % C, KB):
            ht = tl.load(h_rows[None, :] + (c0 * 64 + tl.arange(0, 64))[:, None])
            acc = mxfp4_block_dot(w_ptr + (blk + c0) * 2048, s_ptr + (blk + c0) * 128, ht, acc,
                                  1, MMA, DECODE, INTERPRET)
        if HAS_BIAS:
            acc += tl.load(b_ptr + expert * H + offs_n).to(tl.float32)[:, None]
        out += acc * token_weight[None, :]
    store_mask = (offs_m < M)[None, :]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    if SPLIT == 1:
        tl.store(out_ptrs, out.to(tl.bfloat16), mask=store_mask)
    else:
        tl.store(partial_ptr + (pid_split * M + offs_m[None, :]) * H + offs_n[:, None], out, mask=store_mask)
        # The last of this row block's SPLIT programs adds the partials (arrival.py).
        if last_to_arrive(counter_ptr + pid_n, SPLIT):
            total = tl.zeros((64, M_PAD), dtype=tl.float32)
            for p in tl.static_range(SPLIT):  # fixed order: the same sum whichever program is last
                total += tl.load(partial_ptr + (p * M + offs_m[None, :]) * H + offs_n[:, None], mask=store_mask,
                                 other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(tl.bfloat16), mask=store_mask)
            reset_arrivals(counter_ptr + pid_n)
