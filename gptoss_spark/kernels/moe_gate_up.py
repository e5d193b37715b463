"""Fused decode MoE, stage 1 of 2: gate_up GEMM on MXFP4 weights + bias + SwiGLU.

Grid (I tiles, expert slots). Program (i, s) computes, for the s-th distinct
expert selected by any token (the router kernel published the list), rows [i*BLOCK_I, (i+1)*BLOCK_I) of gate and up
for all tokens at once (tokens are the N side of the tensor-core tile), then
writes h = swiglu(gate, up) in bf16 for the tokens routed to that expert.
Slots past the number of distinct experts exit at once.

The checkpoint interleaves gate and up rows (2j = gate j, 2j+1 = up j), so a
program reads gate rows 2*i and up rows 2*i+1 as two strided row sets and
needs no repack. MXFP4 weights go to tl.dot_scaled as stored (uint8 packed
along K + e8m0 scales); Triton dequantizes in registers, or uses the block-
scaled MMA where the target has it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .mxfp4_decode import mxfp4_dot
from .routing import tokens_of_expert

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


@triton.jit(do_not_specialize=["M"])
def moe_gate_up_kernel(
    x_ptr,
    w_ptr, s_ptr, b_ptr,
    h_ptr, ids_ptr, experts_ptr, n_experts_ptr,
    M, E, H, I,
    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_be,
    TOPK: tl.constexpr, M_PAD: tl.constexpr,
    BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, DECODE: tl.constexpr, INTERPRET: tl.constexpr,
    ALPHA: tl.constexpr = SWIGLU_ALPHA, LIMIT: tl.constexpr = SWIGLU_LIMIT,
):
    pid_i = tl.program_id(0)
    slot = tl.program_id(1)
    offs_m = tl.arange(0, M_PAD)
    offs_t = tl.arange(0, TOPK)
    n_experts = tl.load(n_experts_ptr)
    if slot < n_experts:
        expert = tl.load(experts_ptr + slot)
        ids = tl.load(ids_ptr + offs_m[:, None] * TOPK + offs_t[None, :], mask=(offs_m < M)[:, None], other=-1)
        routed, token_slot = tokens_of_expert(ids, expert, M, M_PAD, TOPK)
        offs_i = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
        i_ok = offs_i < I
        gate_rows = 2 * offs_i
        up_rows = gate_rows + 1
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        s_base = s_ptr + expert.to(tl.int64) * stride_se
        offs_kb = tl.arange(0, BLOCK_K // 2)   # packed bytes
        offs_ks = tl.arange(0, BLOCK_K // 32)  # scales
        x_rows = x_ptr + offs_m * stride_xm
        acc_gate = tl.zeros((BLOCK_I, M_PAD), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_I, M_PAD), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            kb = k0 // 2 + offs_kb
            ks = k0 // 32 + offs_ks
            kb_ok = (kb < H // 2)[None, :]
            ks_ok = (ks < H // 32)[None, :]
            w_gate = tl.load(w_base + gate_rows[:, None] * stride_wn + kb[None, :], mask=i_ok[:, None] & kb_ok, other=0)
            w_up = tl.load(w_base + up_rows[:, None] * stride_wn + kb[None, :], mask=i_ok[:, None] & kb_ok, other=0)
            s_gate = tl.load(s_base + gate_rows[:, None] * stride_sn + ks[None, :], mask=i_ok[:, None] & ks_ok, other=0)
            s_up = tl.load(s_base + up_rows[:, None] * stride_sn + ks[None, :], mask=i_ok[:, None] & ks_ok, other=0)
            acc_gate = mxfp4_dot(w_gate, s_gate, x_rows + k0, routed, H - k0, acc_gate,
                                 BLOCK_I, BLOCK_K, DECODE, INTERPRET)
            acc_up = mxfp4_dot(w_up, s_up, x_rows + k0, routed, H - k0, acc_up,
                               BLOCK_I, BLOCK_K, DECODE, INTERPRET)
        if HAS_BIAS:
            b_base = b_ptr + expert.to(tl.int64) * stride_be
            acc_gate += tl.load(b_base + gate_rows, mask=i_ok, other=0.0).to(tl.float32)[:, None]
            acc_up += tl.load(b_base + up_rows, mask=i_ok, other=0.0).to(tl.float32)[:, None]
        gate = tl.minimum(acc_gate, LIMIT)
        up = tl.minimum(tl.maximum(acc_up, -LIMIT), LIMIT)
        h = (up + 1.0) * gate * tl.sigmoid(ALPHA * gate)
        # h is [M, TOPK, I]: token m's k-th expert output row.
        h_ptrs = h_ptr + (offs_m[None, :] * TOPK + token_slot[None, :]) * I + offs_i[:, None]
        tl.store(h_ptrs, h.to(tl.bfloat16), mask=i_ok[:, None] & routed[None, :])
