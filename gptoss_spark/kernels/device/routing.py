"""Top-k routing as Triton helpers (not kernels).

publish_routing: top-k + softmax of all M tokens from the router's partial
logits (M x E fp32, at most 32 x 128), then the list of distinct experts any
token chose. The expert kernels' grid slot s takes the s-th of those, so each
expert's weights are read once per layer, however many tokens chose it, and no
host round-trip decides the grid.

Who runs it depends on the launch plan (moe.launch_plan): from a few tokens
on, the router kernel's last program, once; at the fewest tokens every gate_up
program runs the top-k itself (topk_softmax, expert_of_slot) and its first
program stores the tables for down, so the router ends without an arrival and
a serial tail. At one token a gate_up program needs only its slot's expert,
the token's pick number `slot` (topk_logits, pick_of_token0): no list, no scan.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def topk_logits(partial_ptr, M, E, N_SPLIT: tl.constexpr, M_PAD: tl.constexpr, E_PAD: tl.constexpr, TOPK: tl.constexpr):
    """-> ids int32 [M_PAD, TOPK] (each token's picks, largest logit first), vals fp32 [M_PAD, TOPK]
    (their logits), used int32 [E_PAD] (1 = some token chose it).

    Ties go to the lower expert index (torch.topk does not promise any order).
    Rows m >= M are padding: they mark nothing as used (their ids and vals are never stored).
    """
    offs_m = tl.arange(0, M_PAD)
    offs_e = tl.arange(0, E_PAD)
    offs_t = tl.arange(0, TOPK)
    valid = (offs_m[:, None] < M) & (offs_e[None, :] < E)
    logits = tl.zeros((M_PAD, E_PAD), dtype=tl.float32)
    for s in tl.static_range(N_SPLIT):  # unrolled: all partial loads in flight at once, not N_SPLIT L2 round trips
        # .cg: straight from L2, where other programs' partials are (never a stale L1 line).
        logits += tl.load(partial_ptr + s * M * E + offs_m[:, None] * E + offs_e[None, :], mask=valid, other=0.0,
                          cache_modifier=".cg")
    logits = tl.where(valid, logits, float("-inf"))
    ids = tl.zeros((M_PAD, TOPK), dtype=tl.int32)
    vals = tl.zeros((M_PAD, TOPK), dtype=tl.float32)
    if (TOPK == 4) & (M_PAD <= 4):
        # gpt-oss's top-4 at 1-4 tokens (at 1-2 in every gate_up program, before its loop): one
        # reduction of ranked lists of four (logit, index) pairs instead of four reductions one after
        # another, each waiting for the last: -0.2 us of gate_up at one token though it issues more
        # instructions (H200). Each element is a list of itself and three placeholders, 8
        # values, so only up to 4 rows (4 elements per thread); taller tiles take the rounds below.
        ninf = tl.full((M_PAD, E_PAD), float("-inf"), tl.float32)
        none = tl.full((M_PAD, E_PAD), E_PAD, tl.int32)  # a placeholder ranks after every expert
        index = tl.broadcast_to(offs_e[None, :], (M_PAD, E_PAD))
        v0, v1, v2, v3, i0, i1, i2, i3 = tl.reduce((logits, ninf, ninf, ninf, index, none, none, none), 1,
                                                   _merge_top4)
        picks = ((v0, i0), (v1, i1), (v2, i2), (v3, i3))
        for j in tl.static_range(4):
            ids = tl.where(offs_t[None, :] == j, picks[j][1][:, None], ids)
            vals = tl.where(offs_t[None, :] == j, picks[j][0][:, None], vals)
        used = used_of(ids, M, M_PAD, E_PAD, TOPK)
    else:
        for j in tl.static_range(TOPK):
            # One reduction of (logit, index) pairs per pick, not a max beside an argmax.
            best, arg = tl.max(logits, axis=1, return_indices=True, return_indices_tie_break_left=True)
            ids = tl.where(offs_t[None, :] == j, arg[:, None].to(tl.int32), ids)
            vals = tl.where(offs_t[None, :] == j, best[:, None], vals)
            logits = tl.where(offs_e[None, :] == arg[:, None], float("-inf"), logits)
        # Selected entries are exactly the valid ones now at -inf (router logits are finite).
        used = tl.max(tl.where(valid & (logits == float("-inf")), 1, 0), axis=0)
    return ids, vals, used


@triton.jit
def _ranks_first(va, ia, vb, ib):
    """(va, ia) ranks before (vb, ib): the larger logit; on a tie, the lower expert index."""
    return (va > vb) | ((va == vb) & (ia < ib))


@triton.jit
def _first(va, ia, vb, ib):
    """The pair of the two that ranks first."""
    a = _ranks_first(va, ia, vb, ib)
    return tl.where(a, va, vb), tl.where(a, ia, ib)


@triton.jit
def _order(va, ia, vb, ib):
    """Two pairs -> (first, second) by rank: a compare-exchange."""
    a = _ranks_first(va, ia, vb, ib)
    return tl.where(a, va, vb), tl.where(a, ia, ib), tl.where(a, vb, va), tl.where(a, ib, ia)


@triton.jit
def _merge_top4(a0, a1, a2, a3, ia0, ia1, ia2, ia3, b0, b1, b2, b3, ib0, ib1, ib2, ib3):
    """Two lists of four pairs, each in rank order -> the four that rank first of the eight, in order.

    Batcher's bitonic merge: a_k against b_(3-k) keeps the first four (in a bitonic order), two
    rounds of compare-exchange sort them. Rank is a total order on experts (indices differ;
    placeholders tie only with each other and never outrank an expert), so the result is what four
    rounds of "largest logit, lowest index on a tie" give, whatever order the reduction merges in.
    """
    c0, j0 = _first(a0, ia0, b3, ib3)
    c1, j1 = _first(a1, ia1, b2, ib2)
    c2, j2 = _first(a2, ia2, b1, ib1)
    c3, j3 = _first(a3, ia3, b0, ib0)
    c0, j0, c2, j2 = _order(c0, j0, c2, j2)
    c1, j1, c3, j3 = _order(c1, j1, c3, j3)
    c0, j0, c1, j1 = _order(c0, j0, c1, j1)
    c2, j2, c3, j3 = _order(c2, j2, c3, j3)
    return c0, c1, c2, c3, j0, j1, j2, j3


@triton.jit
def softmax_rows(vals):
    """[rows, TOPK] logits -> the routing weights: a softmax over each row."""
    p = tl.exp(vals - tl.max(vals, axis=1)[:, None])
    return p / tl.sum(p, axis=1)[:, None]


@triton.jit
def topk_softmax(partial_ptr, M, E, N_SPLIT: tl.constexpr, M_PAD: tl.constexpr, E_PAD: tl.constexpr, TOPK: tl.constexpr):
    """-> ids int32 [M_PAD, TOPK], weights fp32 [M_PAD, TOPK], used int32 [E_PAD] (topk_logits, softmax_rows)."""
    ids, vals, used = topk_logits(partial_ptr, M, E, N_SPLIT, M_PAD, E_PAD, TOPK)
    return ids, softmax_rows(vals), used


@triton.jit
def tokens_of_expert(ids, expert, M, M_PAD: tl.constexpr, TOPK: tl.constexpr):
    """For each token: routed (bool [M_PAD]) and which of its TOPK slots holds `expert` (int32 [M_PAD])."""
    offs_m = tl.arange(0, M_PAD)
    offs_t = tl.arange(0, TOPK)
    match = (ids == expert) & (offs_m[:, None] < M)
    routed = tl.max(match.to(tl.int32), axis=1) > 0
    slot = tl.sum(tl.where(match, offs_t[None, :], 0), axis=1)
    return routed, slot


@triton.jit
def publish_routing(partial_ptr, ids_ptr, weights_ptr, experts_ptr, n_experts_ptr,
                    M, E, N_SPLIT: tl.constexpr, M_PAD: tl.constexpr, E_PAD: tl.constexpr, TOPK: tl.constexpr):
    """Top-k of the summed partials -> ids/weights [M, TOPK], the distinct experts in index order, their count."""
    ids, weights, used = topk_softmax(partial_ptr, M, E, N_SPLIT, M_PAD, E_PAD, TOPK)
    store_routing(ids, weights, used, ids_ptr, weights_ptr, experts_ptr, n_experts_ptr, M, E, M_PAD, E_PAD, TOPK)


@triton.jit
def store_routing(ids, weights, used, ids_ptr, weights_ptr, experts_ptr, n_experts_ptr,
                  M, E, M_PAD: tl.constexpr, E_PAD: tl.constexpr, TOPK: tl.constexpr):
    """topk_softmax's results -> the tables the expert kernels read."""
    offs_m = tl.arange(0, M_PAD)
    offs_t = tl.arange(0, TOPK)
    offs_e = tl.arange(0, E_PAD)
    row_ok = (offs_m < M)[:, None]
    tl.store(ids_ptr + offs_m[:, None] * TOPK + offs_t[None, :], ids, mask=row_ok)
    tl.store(weights_ptr + offs_m[:, None] * TOPK + offs_t[None, :], weights, mask=row_ok)
    rank = tl.cumsum(used, axis=0) - 1
    tl.store(experts_ptr + rank, offs_e.to(tl.int32), mask=(used > 0) & (offs_e < E))
    tl.store(n_experts_ptr, tl.sum(used, axis=0))


@triton.jit
def expert_of_slot(used, slot, E_PAD: tl.constexpr):
    """-> (the slot-th distinct expert in index order, the number of distinct experts); used as topk_softmax's."""
    offs_e = tl.arange(0, E_PAD)
    rank = tl.cumsum(used, axis=0) - 1
    expert = tl.sum(tl.where((used > 0) & (rank == slot), offs_e, 0), axis=0)
    return expert, tl.sum(used, axis=0)


@triton.jit
def used_of(ids, M, M_PAD: tl.constexpr, E_PAD: tl.constexpr, TOPK: tl.constexpr):
    """ids [M_PAD, TOPK] -> used int32 [E_PAD] (1 = some token m < M chose it), as topk_softmax's."""
    hit = (ids[:, :, None] == tl.arange(0, E_PAD)[None, None, :]) & (tl.arange(0, M_PAD) < M)[:, None, None]
    return tl.max(tl.max(hit.to(tl.int32), axis=1), axis=0)


@triton.jit
def pick_of_token0(ids, slot, M_PAD: tl.constexpr, TOPK: tl.constexpr):
    """ids [M_PAD, TOPK] -> token 0's pick number `slot`."""
    at = (tl.arange(0, M_PAD)[:, None] == 0) & (tl.arange(0, TOPK)[None, :] == slot)
    return tl.sum(tl.sum(tl.where(at, ids, 0), axis=1), axis=0)


@triton.jit
def rows_to(v, R: tl.constexpr, M_PAD: tl.constexpr):
    """A vector over R rows -> the same over M_PAD rows: zero past R, rows past M_PAD dropped (a select)."""
    pick = tl.arange(0, R)[None, :] == tl.arange(0, M_PAD)[:, None]
    return tl.sum(tl.where(pick, v[None, :], 0), axis=1)
