"""Top-k routing as a Triton helper (not a kernel): inlined into the expert kernels' prologue.

Every program of the expert kernels recomputes the top-k of all M tokens from
the router's partial logits (M x E fp32, at most 32 x 128: a few hundred
cycles). That costs less than one more launch and lets the grid pick its
expert without a host round-trip: slot s of the grid takes the s-th distinct
expert any token selected, so each expert's weights are read once per layer,
however many tokens chose it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def topk_softmax(partial_ptr, M, E, N_SPLIT, M_PAD: tl.constexpr, E_PAD: tl.constexpr, TOPK: tl.constexpr):
    """-> ids int32 [M_PAD, TOPK], weights fp32 [M_PAD, TOPK], used int32 [E_PAD] (1 = some token chose it).

    Ties go to the lower expert index (torch.topk does not promise any order).
    Rows m >= M are padding: their ids are 0 and they mark nothing as used.
    """
    offs_m = tl.arange(0, M_PAD)
    offs_e = tl.arange(0, E_PAD)
    offs_t = tl.arange(0, TOPK)
    valid = (offs_m[:, None] < M) & (offs_e[None, :] < E)
    logits = tl.zeros((M_PAD, E_PAD), dtype=tl.float32)
    for s in range(N_SPLIT):
        logits += tl.load(partial_ptr + s * M * E + offs_m[:, None] * E + offs_e[None, :], mask=valid, other=0.0)
    logits = tl.where(valid, logits, float("-inf"))
    ids = tl.zeros((M_PAD, TOPK), dtype=tl.int32)
    vals = tl.zeros((M_PAD, TOPK), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        best = tl.max(logits, axis=1)
        arg = tl.argmax(logits, axis=1, tie_break_left=True).to(tl.int32)
        ids = tl.where(offs_t[None, :] == j, arg[:, None], ids)
        vals = tl.where(offs_t[None, :] == j, best[:, None], vals)
        logits = tl.where(offs_e[None, :] == arg[:, None], float("-inf"), logits)
    # Selected entries are exactly the valid ones now at -inf (router logits are finite).
    used = tl.max(tl.where(valid & (logits == float("-inf")), 1, 0), axis=0)
    p = tl.exp(vals - tl.max(vals, axis=1)[:, None])
    weights = p / tl.sum(p, axis=1)[:, None]
    return ids, weights, used


@triton.jit
def expert_of_slot(used, slot, E_PAD: tl.constexpr):
    """The slot-th (0-based) expert with used == 1, in index order; E_PAD when slot >= count."""
    offs_e = tl.arange(0, E_PAD)
    rank = tl.cumsum(used, axis=0) - 1
    hit = (used > 0) & (rank == slot)
    return tl.min(tl.where(hit, offs_e, E_PAD), axis=0)


@triton.jit
def tokens_of_expert(ids, expert, M, M_PAD: tl.constexpr, TOPK: tl.constexpr):
    """For each token: routed (bool [M_PAD]) and which of its TOPK slots holds `expert` (int32 [M_PAD])."""
    offs_m = tl.arange(0, M_PAD)
    offs_t = tl.arange(0, TOPK)
    match = (ids == expert) & (offs_m[:, None] < M)
    routed = tl.max(match.to(tl.int32), axis=1) > 0
    slot = tl.sum(tl.where(match, offs_t[None, :], 0), axis=1)
    return routed, slot
