"""Fused decode MoE, stage 2 of 2: down GEMM on MXFP4 weights + bias + routing-weighted combine.

Grid (H / 64 row blocks, SPLIT). The SPLIT programs of a row block are
SPLIT / K_PARTS expert groups x K_PARTS shares of K: program (n, p) loops over
the distinct experts g, g + SPLIT / K_PARTS, ... (g = p // K_PARTS) that the
router published and sums weight_k * (h_k @ W2_e^T + b2_e) over its share of
K (p % K_PARTS) for its 64 rows in fp32 registers. SPLIT = 1 writes bf16 out
directly. SPLIT > 1 sums the SPLIT programs' fp32 shares of each element in
one of two ways, both deterministic and without an extra launch:
- COUNTED (few tokens, moe.launch_plan): each program adds each element to
  a 64-bit word of `sums` in fixed point with a count (counted_sum.py: one
  atomic round trip, the same bits in any order); the program whose add is
  an element's last writes it as bf16 and zeroes the word.
- otherwise each writes fp32 partials [SPLIT, M, H]; the last of a row
  block's SPLIT programs to finish (an arrival counter per row block,
  arrival.py) adds them in a fixed order and writes bf16.
The split exists because H / 64 alone is 45
programs, too few to keep enough bytes in flight; the K shares exist because
one token selects only 4 experts, so without them half of a split of 8 would
idle while the other half read a whole expert each (moe.launch_plan).

Padding columns point at token 0 and are never stored; up to 16 token
columns they are not read either (mxfp4_decode.load_activations; at one token
only the routed token is read). Otherwise a token not routed to the expert
reads its slot-0 row (written by stage 1, finite) and is weighted 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .arrival import last_to_arrive, reset_arrivals
from .counted_sum import counted_add
from .mxfp4_decode import mxfp4_rows_dot
from .pdl import pdl_launch_next, pdl_wait
from .routing import tokens_of_expert


@triton.jit(do_not_specialize=["M"])
def moe_down_kernel(
    h_ptr, ids_ptr, weights_ptr, experts_ptr, n_experts_ptr,
    w_ptr, s_ptr, b_ptr, out_ptr, partial_ptr, counter_ptr, sums_ptr,
    M, stride_om,
    H: tl.constexpr, I: tl.constexpr,
    TOPK: tl.constexpr, M_PAD: tl.constexpr, C: tl.constexpr, MMA: tl.constexpr, HAS_BIAS: tl.constexpr,
    DECODE: tl.constexpr, INTERPRET: tl.constexpr, SPLIT: tl.constexpr = 1, K_PARTS: tl.constexpr = 1,
    PDL: tl.constexpr = False, COUNTED: tl.constexpr = False,
):
    KB: tl.constexpr = I // 64
    RB: tl.constexpr = H // 64
    pid_n = tl.program_id(0)
    pid_split = tl.program_id(1)
    offs_m = tl.arange(0, M_PAD)
    offs_t = tl.arange(0, TOPK)
    offs_n = pid_n * 64 + tl.arange(0, 64)
    row_ok = (offs_m < M)[:, None]
    # The routing is read before the PDL wait (-0.2 to -0.3 us at one token, H200): whoever
    # stored it made it visible before this kernel's programs could be placed (pdl.py). .cg: from L2,
    # never a line of an earlier layer's tables left in this SM's L1.
    ids = tl.load(ids_ptr + offs_m[:, None] * TOPK + offs_t[None, :], mask=row_ok, other=-1, cache_modifier=".cg")
    weights = tl.load(weights_ptr + offs_m[:, None] * TOPK + offs_t[None, :], mask=row_ok, other=0.0,
                      cache_modifier=".cg")
    token = tl.where(offs_m < M, offs_m, 0)
    n_experts = tl.load(n_experts_ptr, cache_modifier=".cg")
    KBP: tl.constexpr = (KB + K_PARTS - 1) // K_PARTS  # 64-k blocks per share of K
    k_part = pid_split % K_PARTS
    k_lo = k_part * KBP
    k_hi = tl.minimum(k_lo + KBP, KB)
    # Shares of K: each loops over KBP blocks rounded up to C, masked past its end (mxfp4_rows_dot).
    N_LOOP: tl.constexpr = (KBP + C - 1) // C * C if K_PARTS > 1 else KB // C * C
    GROUPS: tl.constexpr = SPLIT // K_PARTS  # expert groups: group g takes the experts g, g + GROUPS, ...
    out = tl.zeros((64, M_PAD), dtype=tl.float32)
    # The first expert is read with the count, not after it: one L2 round trip fewer before the
    # loop (the list has at least SPLIT entries, moe.py; a slot past the count is never used).
    expert_next = tl.load(experts_ptr + pid_split // K_PARTS, cache_modifier=".cg")
    pdl_wait(PDL)  # h is gate_up's output
    for s in range(pid_split // K_PARTS, n_experts, GROUPS):
        expert = expert_next.to(tl.int64)
        expert_next = tl.load(experts_ptr + s + GROUPS, mask=s + GROUPS < n_experts, other=0)
        routed, token_slot = tokens_of_expert(ids, expert.to(tl.int32), M, M_PAD, TOPK)
        token_weight = tl.sum(tl.where(offs_t[None, :] == token_slot[:, None], weights, 0.0), axis=1)
        token_weight = tl.where(routed, token_weight, 0.0)
        h_rows = h_ptr + (token * TOPK + token_slot) * I
        blk = (expert * RB + pid_n) * KB
        acc = tl.zeros((64, M_PAD), dtype=tl.float32)
        # One loop for every share of K, whose first block is a run-time value (mxfp4_rows_dot).
        # A copy of the loop per share, each with its leftover blocks in a loop of its own, makes
        # ptxas serialize every wgmma of the kernel at one token (C7513), each k16 step waiting
        # for the one before.
        # Up to 16 token columns only the columns that count are read (mxfp4_decode.load_activations).
        # Which mask is what ptxas fits best (sm_90a): with K shares (one token) the routed tokens
        # (168 registers; the token count: 213), else the token count (156; routed: 181).
        act_ok = routed if K_PARTS > 1 else offs_m < M
        acc = mxfp4_rows_dot(w_ptr, s_ptr, blk, h_rows, act_ok, k_lo, k_hi, N_LOOP, K_PARTS > 1, acc, C, MMA, DECODE,
                             INTERPRET, M_PAD <= 16)
        if HAS_BIAS:
            bias = tl.load(b_ptr + expert * H + offs_n).to(tl.float32)
            if K_PARTS > 1:  # once per expert: by the share that holds k = 0
                bias = tl.where(k_part == 0, bias, 0.0)
            acc += bias[:, None]
        out += acc * token_weight[None, :]
    pdl_launch_next(PDL)  # the next layer's router gets placed during the epilogue
    store_mask = (offs_m < M)[None, :]
    out_ptrs = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
    if SPLIT == 1:
        tl.store(out_ptrs, out.to(tl.bfloat16), mask=store_mask)
    elif COUNTED:
        # Every one of the row block's SPLIT programs adds every element it covers (zeros where it
        # had no expert), so each element's count reaches SPLIT. One L2 round trip after the loop
        # where the partials below take three (H200: -0.2 to -0.7 us per layer at one
        # token; from 8 tokens on layout 2 up to +8 %: its atomics grow with the token columns).
        last, total = counted_add(sums_ptr + offs_m[None, :] * H + offs_n[:, None], out,
                                  tl.broadcast_to(store_mask, (64, M_PAD)), SPLIT, INTERPRET)
        tl.store(out_ptrs, total.to(tl.bfloat16), mask=last)
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
