"""Fused decode MoE, stage 2 of 2: down GEMM on MXFP4 weights + bias + routing-weighted combine.

Grid (H tiles, SPLIT). Program (n, p) loops over the distinct experts
p, p + SPLIT, ... that stage 1 published and sums weight_k * (h_k @ W2_e^T + b2_e)
for its rows in fp32 registers. SPLIT = 1 writes bf16 out directly; SPLIT > 1
writes fp32 partials [SPLIT, M, H] that moe_combine.py adds in a fixed order.
No atomics: the result is deterministic and needs no zeroed buffer. The split
exists because H/BLOCK_N alone is ~90 programs on a 132-SM H200 (48 on GB10),
too few to keep enough bytes in flight.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .mxfp4_decode import mxfp4_dot
from .routing import tokens_of_expert


@triton.jit(do_not_specialize=["M"])
def moe_down_kernel(
    h_ptr, ids_ptr, weights_ptr, experts_ptr, n_experts_ptr,
    w_ptr, s_ptr, b_ptr, out_ptr, partial_ptr,
    M, H, I,
    stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_om,
    TOPK: tl.constexpr, M_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    DECODE: tl.constexpr, INTERPRET: tl.constexpr, SPLIT: tl.constexpr = 1,
):
    pid_n = tl.program_id(0)
    pid_split = tl.program_id(1)
    offs_m = tl.arange(0, M_PAD)
    offs_t = tl.arange(0, TOPK)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < H
    offs_kb = tl.arange(0, BLOCK_K // 2)
    offs_ks = tl.arange(0, BLOCK_K // 32)
    row_ok = (offs_m < M)[:, None]
    ids = tl.load(ids_ptr + offs_m[:, None] * TOPK + offs_t[None, :], mask=row_ok, other=-1)
    weights = tl.load(weights_ptr + offs_m[:, None] * TOPK + offs_t[None, :], mask=row_ok, other=0.0)
    n_experts = tl.load(n_experts_ptr)
    out = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
    for s in range(pid_split, n_experts, SPLIT):
        expert = tl.load(experts_ptr + s)
        routed, token_slot = tokens_of_expert(ids, expert, M, M_PAD, TOPK)
        token_weight = tl.sum(tl.where(offs_t[None, :] == token_slot[:, None], weights, 0.0), axis=1)
        token_weight = tl.where(routed, token_weight, 0.0)
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        s_base = s_ptr + expert.to(tl.int64) * stride_se
        h_rows = h_ptr + (offs_m * TOPK + token_slot) * I
        acc = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            kb = k0 // 2 + offs_kb
            ks = k0 // 32 + offs_ks
            w = tl.load(w_base + offs_n[:, None] * stride_wn + kb[None, :],
                        mask=n_ok[:, None] & (kb < I // 2)[None, :], other=0)
            sc = tl.load(s_base + offs_n[:, None] * stride_sn + ks[None, :],
                         mask=n_ok[:, None] & (ks < I // 32)[None, :], other=0)
            acc = mxfp4_dot(w, sc, h_rows + k0, routed, I - k0, acc, BLOCK_N, BLOCK_K, DECODE, INTERPRET)
        if HAS_BIAS:
            acc += tl.load(b_ptr + expert.to(tl.int64) * stride_be + offs_n, mask=n_ok, other=0.0).to(tl.float32)[:, None]
        out += acc * token_weight[None, :]
    store_mask = n_ok[:, None] & (offs_m < M)[None, :]
    if SPLIT == 1:
        tl.store(out_ptr + offs_m[None, :] * stride_om + offs_n[:, None], out.to(tl.bfloat16), mask=store_mask)
    else:
        tl.store(partial_ptr + (pid_split * M + offs_m[None, :]) * H + offs_n[:, None], out, mask=store_mask)
