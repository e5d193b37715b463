"""Fused decode MoE, stage 1 of 2: gate_up GEMM on MXFP4 weights + bias + SwiGLU.

Grid (I / 64 row blocks, expert slots). Program (b, s) takes the s-th distinct
expert selected by any token (the router kernel published the list) and
computes gate features [64b, 64b + 64) and the same up features for all
tokens at once (tokens are the N side of the tensor-core tile, so the
expert's weights are read once however many tokens chose it), then writes
h = swiglu(gate, up) in bf16 for the tokens routed to that expert. Slots past
the number of distinct experts exit at once.

With HALF_ROWS (one token, moe.launch_plan) the grid is (I / 32, slots) and
program b takes 32 gate and 32 up features, [32b, 32b + 32), over the whole
of K, as one 64-row tensor-core tile (half of a gate block and the same half
of the up block). One token selects only 4 experts: 180 programs of 64
features would be too few for 132 SMs, each a long chain of dependent loop
iterations. Half rows make 360 programs with nothing to add between them,
where two shares of K per program would need a sum (a store, an acq_rel
arrival, a read): -2.7 / -3.0 us per layer on the H200 against the shares,
layouts 3 / 2.

With ROUTE (the fewest tokens, moe.launch_plan) the router kernel stops after
its partial logits, and every program takes the top-k itself from them
(routing.py): at one token that replaces the router's arrival, its last
program's serial top-k and this kernel's read of the tables (two L2 round trips
and a chain of shuffles in one program) with the same top-k run by every
program at once. Program (0, 0) stores the tables for down. At one token
(SLOTS_BY_PICK) slot s is simply the token's pick number s: the picks are
distinct, so no program builds the list of used experts, scans it or matches
tokens to its expert (-1.4 / -0.9 us per layer on layouts 2 / 3, H200);
only program (0, 0) builds the list, for down.

Weights are in the kernels' layout (mxfp4_layout.py): gate rows first, then
up rows, so gate block b is row block b and up block b is row block I/64 + b.
Padding token columns point at row 0 (a real row) and are never stored; up to
16 token columns they are not read either (mxfp4_decode.load_activations), and
K is a multiple of 64.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .mxfp4_decode import load_activations, mxfp4_block_dot, mxfp4_split_block_dot
from .pdl import pdl_release_then_launch_next, pdl_wait
from .routing import (expert_of_slot, pick_of_token0, rows_to, softmax_rows, store_routing, tokens_of_expert,
                      topk_logits, topk_softmax, used_of)

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


@triton.jit
def swiglu(acc_gate, acc_up, b_ptr, expert, pid_b, I: tl.constexpr, HAS_BIAS: tl.constexpr,
           ALPHA: tl.constexpr, LIMIT: tl.constexpr, ROWS: tl.constexpr):
    """bias + gpt-oss SwiGLU of features [ROWS pid_b, ROWS (pid_b + 1)): gate/up sums [ROWS, token columns] -> h (fp32)."""
    offs_i = pid_b * ROWS + tl.arange(0, ROWS)
    if HAS_BIAS:  # gate biases first, then up (mxfp4_layout.gate_up_rows_first)
        b_base = b_ptr + expert * (2 * I)
        acc_gate += tl.load(b_base + offs_i).to(tl.float32)[:, None]
        acc_up += tl.load(b_base + I + offs_i).to(tl.float32)[:, None]
    gate = tl.minimum(acc_gate, LIMIT)
    up = tl.minimum(tl.maximum(acc_up, -LIMIT), LIMIT)
    return (up + 1.0) * gate * tl.sigmoid(ALPHA * gate)


@triton.jit
def _swiglu_store(acc_gate, acc_up, h_ptr, b_ptr, expert, pid_b, routed, token_slot,
                  I: tl.constexpr, TOPK: tl.constexpr, M_PAD: tl.constexpr, HAS_BIAS: tl.constexpr,
                  ALPHA: tl.constexpr, LIMIT: tl.constexpr, ROWS: tl.constexpr):
    """bias + SwiGLU of one program's ROWS features; h (bf16) for the tokens routed to the expert."""
    offs_m = tl.arange(0, M_PAD)
    offs_i = pid_b * ROWS + tl.arange(0, ROWS)
    h = swiglu(acc_gate, acc_up, b_ptr, expert, pid_b, I, HAS_BIAS, ALPHA, LIMIT, ROWS)
    # h is [M, TOPK, I]: token m's k-th expert output row.
    h_ptrs = h_ptr + (offs_m[None, :] * TOPK + token_slot[None, :]) * I + offs_i[:, None]
    tl.store(h_ptrs, h.to(tl.bfloat16), mask=routed[None, :])


@triton.jit
def gate_up_dot(w_ptr, s_ptr, gate_blk, up_blk, x_rows, x_ok, k_lo: tl.constexpr, k_hi: tl.constexpr,
                acc_gate, acc_up, C: tl.constexpr, MMA: tl.constexpr, DECODE: tl.constexpr,
                INTERPRET: tl.constexpr, MASK_COLS: tl.constexpr, HALF_W: tl.constexpr, HALF_S: tl.constexpr):
    """acc_gate/acc_up [64, M_PAD] += the gate/up row block over 64-k blocks k_lo..k_hi; one x tile feeds both.

    With MASK_COLS only the token columns x_ok [M_PAD] are read (mxfp4_decode.load_activations).
    HALF_W != 0 (half rows): one dot per step instead of two, into acc_gate, of the tile that
    mxfp4_split_block_dot puts together from the half block at w_ptr / s_ptr + gate_blk (its rows
    0..31) and the one HALF_W / HALF_S bytes further on (rows 32..63); up_blk and acc_up are unused.
    """
    offs_k = tl.arange(0, C * 64)
    for c0 in range(k_lo, k_hi - (k_hi - k_lo) % C, C):
        xt = load_activations(x_rows[None, :] + (c0 * 64 + offs_k)[:, None], x_ok, MASK_COLS)
        acc_gate = mxfp4_split_block_dot(w_ptr + (gate_blk + c0) * 2048, s_ptr + (gate_blk + c0) * 128, xt,
                                         acc_gate, HALF_W, HALF_S, C, MMA, DECODE, INTERPRET)
        if HALF_W == 0:
            acc_up = mxfp4_block_dot(w_ptr + (up_blk + c0) * 2048, s_ptr + (up_blk + c0) * 128, xt, acc_up,
                                     C, MMA, DECODE, INTERPRET)
    for c0 in tl.static_range(k_hi - (k_hi - k_lo) % C, k_hi):  # the blocks left over when C does not divide
        xt = load_activations(x_rows[None, :] + (c0 * 64 + tl.arange(0, 64))[:, None], x_ok, MASK_COLS)
        acc_gate = mxfp4_split_block_dot(w_ptr + (gate_blk + c0) * 2048, s_ptr + (gate_blk + c0) * 128, xt,
                                         acc_gate, HALF_W, HALF_S, 1, MMA, DECODE, INTERPRET)
        if HALF_W == 0:
            acc_up = mxfp4_block_dot(w_ptr + (up_blk + c0) * 2048, s_ptr + (up_blk + c0) * 128, xt, acc_up,
                                     1, MMA, DECODE, INTERPRET)
    return acc_gate, acc_up


@triton.jit(do_not_specialize=["M"])
def moe_gate_up_kernel(
    x_ptr,
    w_ptr, s_ptr, b_ptr,
    h_ptr, ids_ptr, experts_ptr, n_experts_ptr, logits_ptr, route_weights_ptr,
    M, stride_xm, E,
    H: tl.constexpr, I: tl.constexpr,
    TOPK: tl.constexpr, M_PAD: tl.constexpr, C: tl.constexpr, MMA: tl.constexpr,
    HAS_BIAS: tl.constexpr, DECODE: tl.constexpr, INTERPRET: tl.constexpr, HALF_ROWS: tl.constexpr = False,
    ALPHA: tl.constexpr = SWIGLU_ALPHA, LIMIT: tl.constexpr = SWIGLU_LIMIT, PDL: tl.constexpr = False,
    ROUTE: tl.constexpr = False, N_SPLIT: tl.constexpr = 1, E_PAD: tl.constexpr = 128, TOPK_ROWS: tl.constexpr = 4,
    SLOTS_BY_PICK: tl.constexpr = False,
):
    KB: tl.constexpr = H // 64           # 64-k blocks per row block
    RB: tl.constexpr = I // 64           # row blocks of gate (and of up)
    MASK_COLS: tl.constexpr = M_PAD <= 16  # read only the real tokens' x (mxfp4_decode.load_activations)
    pid_b = tl.program_id(0)
    slot = tl.program_id(1)
    offs_m = tl.arange(0, M_PAD)
    offs_t = tl.arange(0, TOPK)
    pdl_wait(PDL)  # the routing (with ROUTE: the router's partial logits) is the router kernel's output
    # With ROUTE this program stores the routing tables for down, which reads them before its PDL wait:
    # it releases them before it lets down launch.
    stores_routing = (pid_b == 0) & (slot == 0)
    if SLOTS_BY_PICK:
        # One token: slot s takes the token's pick s; h goes to (token 0, slot s). The weights and the
        # list are made in program (0, 0) only: topk_logits' list goes unused, so it is not computed.
        ids_r, vals_r, unused = topk_logits(logits_ptr, M, E, N_SPLIT, TOPK_ROWS, E_PAD, TOPK)
        expert32 = pick_of_token0(ids_r, slot, TOPK_ROWS, TOPK)
        n_experts = TOPK
        if stores_routing:
            store_routing(ids_r, softmax_rows(vals_r), used_of(ids_r, M, TOPK_ROWS, E_PAD, TOPK), ids_ptr,
                          route_weights_ptr, experts_ptr, n_experts_ptr, M, E, TOPK_ROWS, E_PAD, TOPK)
        routed = offs_m == 0
        token_slot = tl.zeros((M_PAD,), dtype=tl.int32) + slot
    elif ROUTE:
        ids_r, weights_r, used = topk_softmax(logits_ptr, M, E, N_SPLIT, TOPK_ROWS, E_PAD, TOPK)
        expert32, n_experts = expert_of_slot(used, slot, E_PAD)
        if stores_routing:  # every program has the tables; one stores them for down
            store_routing(ids_r, weights_r, used, ids_ptr, route_weights_ptr, experts_ptr, n_experts_ptr,
                          M, E, TOPK_ROWS, E_PAD, TOPK)
        routed_r, slot_r = tokens_of_expert(ids_r, expert32, M, TOPK_ROWS, TOPK)
        routed = rows_to(routed_r.to(tl.int32), TOPK_ROWS, M_PAD) > 0
        token_slot = rows_to(slot_r, TOPK_ROWS, M_PAD)
    else:
        # All three reads at once, none waiting for the count: a slot past it reads an unwritten
        # entry of the list (at least E long) and exits below without using it.
        n_experts = tl.load(n_experts_ptr)
        expert32 = tl.load(experts_ptr + slot)
        ids = tl.load(ids_ptr + offs_m[:, None] * TOPK + offs_t[None, :], mask=(offs_m < M)[:, None], other=-1)
        routed, token_slot = tokens_of_expert(ids, expert32, M, M_PAD, TOPK)
    if slot < n_experts:
        expert = expert32.to(tl.int64)
        x_rows = x_ptr + tl.where(offs_m < M, offs_m, 0) * stride_xm
        if HALF_ROWS:
            # Program b: gate and up features [32 b, 32 b + 32) as one 64-row tile, half of
            # gate block b // 2 and the same half of up block b // 2 (mxfp4_split_block_dot).
            blk = expert * (2 * RB * KB) + (pid_b // 2) * KB
            half = pid_b % 2
            acc, _ = gate_up_dot(w_ptr + blk * 2048 + half * 1024, s_ptr + blk * 128 + half * 64, 0, 0, x_rows,
                                 offs_m < M, 0, KB,
                                 tl.zeros((64, M_PAD), dtype=tl.float32), tl.zeros((64, M_PAD), dtype=tl.float32),
                                 C, MMA, DECODE, INTERPRET, MASK_COLS, RB * KB * 2048 - 1024, RB * KB * 128 - 64)
            pdl_release_then_launch_next(PDL, ROUTE and stores_routing)
            # Tile rows 0..31 are gate, 32..63 up: in other warps, so this moves data (shared memory).
            acc_gate, acc_up = tl.split(tl.permute(tl.reshape(acc, (2, 32, M_PAD)), (1, 2, 0)))
            _swiglu_store(acc_gate, acc_up, h_ptr, b_ptr, expert, pid_b, routed, token_slot,
                          I, TOPK, M_PAD, HAS_BIAS, ALPHA, LIMIT, 32)
        else:
            gate_blk = expert * (2 * RB * KB) + pid_b * KB
            acc_gate, acc_up = gate_up_dot(w_ptr, s_ptr, gate_blk, gate_blk + RB * KB, x_rows, offs_m < M, 0, KB,
                                           tl.zeros((64, M_PAD), dtype=tl.float32),
                                           tl.zeros((64, M_PAD), dtype=tl.float32),
                                           C, MMA, DECODE, INTERPRET, MASK_COLS, 0, 0)
            pdl_release_then_launch_next(PDL, ROUTE and stores_routing)
            _swiglu_store(acc_gate, acc_up, h_ptr, b_ptr, expert, pid_b, routed, token_slot,
                          I, TOPK, M_PAD, HAS_BIAS, ALPHA, LIMIT, 64)
