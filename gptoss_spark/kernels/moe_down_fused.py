"""Fused decode MoE at few tokens: gate_up's programs also do down, so a layer is two launches.

gate_up's program (b, s) ends holding h for row block b of the s-th selected
expert: 64 of the expert's I intermediate features, for every token. Those
64 features are exactly the 64-k block b of the down GEMM's K. So the program
goes on to multiply them by the expert's down column block b (H / 64 tiles of
64 x 64, one per output row block) and adds weight * (W2[:, block b] @ h_b)
into an fp32 accumulator [M, H] with atomic adds. The last program to finish
(arrival.py) adds the routing-weighted down biases, writes the bf16 output and
zeroes the accumulator, so it is zero again for the next call and the next
replay of a CUDA graph (moe._accumulator).

Why: at one token the separate down kernel was mostly fixed cost (launch,
prologue, pipeline fill, split partials and its last-to-arrive epilogue)
while its weights are 4 us at the roofline (docs/KERNELS.md). Here down's
blocks stream in the same programs right after gate_up's, with no second
kernel's phases to wait through.

What it costs: the sum over gate_up's row blocks happens in atomics, in
whatever order programs finish, so the output's last fp32 bits vary run to
run (the tests compare against the reference within a tolerance, as for the
unfused path). And the atomics grow with tokens x experts, so only the fewest
tokens take this path (moe.launch_plan).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .arrival import arrive, fence_writes, reset_arrivals
from .mxfp4_decode import mxfp4_stacked_dot


@triton.jit
def token_weights(weights_ptr, routed, token_slot, M, M_PAD: tl.constexpr, TOPK: tl.constexpr):
    """Each token's routing weight for this program's expert (0 for tokens not routed to it) [M_PAD]."""
    offs_m = tl.arange(0, M_PAD)
    offs_t = tl.arange(0, TOPK)
    weights = tl.load(weights_ptr + offs_m[:, None] * TOPK + offs_t[None, :], mask=(offs_m < M)[:, None], other=0.0)
    w = tl.sum(tl.where(offs_t[None, :] == token_slot[:, None], weights, 0.0), axis=1)
    return tl.where(routed, w, 0.0)


@triton.jit
def add_down_of_h_block(h, token_weight, routed, expert, pid_b, w2_ptr, s2_ptr, acc_ptr,
                        H: tl.constexpr, I: tl.constexpr, M_PAD: tl.constexpr, R: tl.constexpr, MMA: tl.constexpr,
                        DECODE: tl.constexpr, INTERPRET: tl.constexpr, N_LO: tl.constexpr, N_HI: tl.constexpr):
    """acc[m, rows] += token_weight[m] * (W2_e[rows, 64 pid_b : 64 pid_b + 64] @ h[:, m]) for the routed tokens m,
    rows = output row blocks N_LO..N_HI.

    h fp32 [64 (down's k), M_PAD] is rounded to bf16 as the unfused path stores it, and the
    weight multiplies the fp32 product, as the unfused down kernel does. R output row blocks
    per loop iteration (one R*64-row tensor-core tile), then the ones left over one at a time.
    The bounds are constexpr (run-time bounds cost a pipelined loop registers, moe_down.py).
    """
    RBH: tl.constexpr = H // 64  # output row blocks
    KBI: tl.constexpr = I // 64  # down's 64-k blocks per row block: the stride between row blocks' block b
    hb = h.to(tl.bfloat16)
    offs_m = tl.arange(0, M_PAD)
    first = w2_ptr + (expert * RBH * KBI + pid_b) * 2048
    first_s = s2_ptr + (expert * RBH * KBI + pid_b) * 128
    rows = tl.arange(0, R * 64)
    mask = (rows[:, None] >= 0) & routed[None, :]
    for n0 in range(N_LO, N_HI - (N_HI - N_LO) % R, R):
        part = mxfp4_stacked_dot(first + n0 * KBI * 2048, first_s + n0 * KBI * 128, KBI, hb,
                                 tl.zeros((R * 64, M_PAD), dtype=tl.float32), R, MMA, DECODE, INTERPRET)
        tl.atomic_add(acc_ptr + offs_m[None, :] * H + (n0 * 64 + rows)[:, None], part * token_weight[None, :],
                      mask=mask, sem="relaxed")
    rows1 = tl.arange(0, 64)
    mask1 = (rows1[:, None] >= 0) & routed[None, :]
    for n in range(N_HI - (N_HI - N_LO) % R, N_HI):
        part = mxfp4_stacked_dot(first + n * KBI * 2048, first_s + n * KBI * 128, KBI, hb,
                                 tl.zeros((64, M_PAD), dtype=tl.float32), 1, MMA, DECODE, INTERPRET)
        tl.atomic_add(acc_ptr + offs_m[None, :] * H + (n * 64 + rows1)[:, None], part * token_weight[None, :],
                      mask=mask1, sem="relaxed")


@triton.jit
def finish_if_last(finish_ptr, units, total, acc_ptr, out_ptr, b2_ptr, ids_ptr, weights_ptr, M, stride_om,
                   H: tl.constexpr, TOPK: tl.constexpr, HAS_BIAS: tl.constexpr, INTERPRET: tl.constexpr):
    """Arrive with this program's share of the down work; the program completing the total writes the output."""
    if arrive(finish_ptr, units, INTERPRET) + units == total:
        fence_writes(INTERPRET)  # every thread acquires, not only the one that ran the atomic
        finish_output(acc_ptr, out_ptr, b2_ptr, ids_ptr, weights_ptr, M, stride_om, H, TOPK, HAS_BIAS, INTERPRET)
        reset_arrivals(finish_ptr)


@triton.jit
def finish_output(acc_ptr, out_ptr, b2_ptr, ids_ptr, weights_ptr, M, stride_om,
                  H: tl.constexpr, TOPK: tl.constexpr, HAS_BIAS: tl.constexpr, INTERPRET: tl.constexpr):
    """out[m] = bf16(acc[m] + sum_k weight[m, k] * b2[ids[m, k]]); acc[m] = 0. Run by the last program only."""
    BLOCK: tl.constexpr = 1024
    for m in range(M):
        for h0 in tl.static_range(0, H, BLOCK):  # unrolled: every chunk's loads in flight at once
            offs = h0 + tl.arange(0, BLOCK)
            ok = offs < H
            # Read and zero in one atomic, where the other programs' atomic adds were performed:
            # plain loads here (even .cg, after the acquire) missed some of them at 2+ tokens
            # on the H200 (benchmarks/kernels/results/run17).
            if INTERPRET:  # (no float atomic_xchg there; its programs run one at a time)
                y = tl.load(acc_ptr + m * H + offs, mask=ok, other=0.0)
                tl.store(acc_ptr + m * H + offs, tl.zeros((BLOCK,), dtype=tl.float32), mask=ok)
            else:
                y = tl.atomic_xchg(acc_ptr + m * H + offs, tl.zeros((BLOCK,), dtype=tl.float32), mask=ok,
                                   sem="relaxed")
            if HAS_BIAS:
                for t in tl.static_range(TOPK):
                    e = tl.load(ids_ptr + m * TOPK + t).to(tl.int64)
                    w = tl.load(weights_ptr + m * TOPK + t)
                    y += w * tl.load(b2_ptr + e * H + offs, mask=ok, other=0.0).to(tl.float32)
            tl.store(out_ptr + m * stride_om + offs, y.to(tl.bfloat16), mask=ok)
