"""Routing of a prefill chunk in Triton: router logits, top-k, softmax, and the (token, k) pairs
grouped by expert into the prefill kernels' blocks; and the sum of each token's k outputs.

Why kernels and not torch: torch's fp32 router GEMM, topk, softmax and the argsort-based
grouping took 84-147 us per gpt-oss-120b layer at 32-512 tokens on the H200, against 43-65 us
for the whole of triton_kernels' routing, while our two expert kernels were 0-10 % faster than
its matmuls (benchmarks/kernels/peer_attribution.py; docs/KERNELS.md, "Prefill"). Three launches
and a memset replace some thirty torch kernels, with no host sync, so a CUDA graph holds them:

  route    prefill_router_kernel (grid: tiles of BLOCK_T tokens): logits [BLOCK_T, E] in fp32
           from the bf16 x and router weight (a tensor-core dot with fp32 accumulation: each
           product is exact, as in the reference's fp32 GEMM; only the summation order differs),
           plus the bias; the top-k, largest first, ties to the lower expert (as the decode
           router, routing.topk_logits); the softmax over the k. Each program adds its tile's
           pairs per expert into counts [E]: integer atomics, the same sum in any order.
  align    prefill_align_kernel (grid: one program per expert): the blocks before expert e
           (counts rounded up to BLOCK_M, prefix sum over experts), then e's pairs in token
           order into its blocks and M*K into the rest of its last one, and block_expert for
           its blocks; the last program marks the unused tail -1. The same tables as the
           reference's align_pairs_ref, which the tests compare it with.
  combine  prefill_combine_kernel: y [M*K, H] fp32 summed over each token's k pairs, k = 0
           first (a fixed order: deterministic), to bf16.

Any expert count works: the kernels hold the experts padded to a power of two of at least 16
(experts_pad: tl.arange's and the router dot's shapes), the padding at -inf.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import interpreting
from .mxfp4_decode import dot_bf16
from .routing import softmax_rows

ROUTER_BLOCK_T = 16   # tokens per router program: 32 programs at 512 tokens, each reading the 0.7 MB weight from L2
ROUTER_BLOCK_K = 64
ALIGN_CHUNK = 1024    # pairs an align program scans per step
COMBINE_BLOCK_H = 1024


@triton.jit(do_not_specialize=["M"])
def prefill_router_kernel(x_ptr, w_ptr, b_ptr, ids_ptr, weights_ptr, counts_ptr, M, stride_xm, stride_we,
                          H: tl.constexpr, E: tl.constexpr, E_PAD: tl.constexpr, TOPK: tl.constexpr,
                          HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
                          INTERPRET: tl.constexpr):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_e = tl.arange(0, E_PAD)
    e_ok = offs_e < E
    t_ok = offs_t < M
    acc = tl.zeros((BLOCK_T, E_PAD), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < H
        xt = tl.load(x_ptr + offs_t[:, None] * stride_xm + k[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(w_ptr + offs_e[None, :] * stride_we + k[:, None], mask=k_ok[:, None] & e_ok[None, :], other=0.0)
        acc = dot_bf16(xt, wt, acc, INTERPRET)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_e, mask=e_ok, other=0.0).to(tl.float32)[None, :]
    acc = tl.where(e_ok[None, :], acc, float("-inf"))  # padding experts are never picked
    offs_j = tl.arange(0, TOPK)
    ids = tl.zeros((BLOCK_T, TOPK), dtype=tl.int32)
    vals = tl.zeros((BLOCK_T, TOPK), dtype=tl.float32)
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    for j in tl.static_range(TOPK):
        best, arg = tl.max(acc, axis=1, return_indices=True, return_indices_tie_break_left=True)
        ids = tl.where(offs_j[None, :] == j, arg[:, None].to(tl.int32), ids)
        vals = tl.where(offs_j[None, :] == j, best[:, None], vals)
        picked = offs_e[None, :] == arg[:, None]
        acc = tl.where(picked, float("-inf"), acc)
        counts += tl.sum((picked & t_ok[:, None]).to(tl.int32), axis=0)
    out = offs_t[:, None] * TOPK + offs_j[None, :]
    tl.store(ids_ptr + out, ids, mask=t_ok[:, None])
    tl.store(weights_ptr + out, softmax_rows(vals), mask=t_ok[:, None])
    tl.atomic_add(counts_ptr + offs_e, counts, mask=counts > 0)  # > 0: never a padding expert


@triton.jit(do_not_specialize=["N_PAIRS", "N_BLOCKS"])
def prefill_align_kernel(ids_ptr, counts_ptr, pairs_ptr, block_expert_ptr, N_PAIRS, N_BLOCKS,
                         E: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    e = tl.program_id(0)
    offs_e = tl.arange(0, E_PAD)
    counts = tl.load(counts_ptr + offs_e, mask=offs_e < E, other=0)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(blocks, axis=0)
    mine = offs_e == e
    count = tl.sum(tl.where(mine, counts, 0), axis=0)
    end = tl.sum(tl.where(mine, ends, 0), axis=0)
    start = end - tl.sum(tl.where(mine, blocks, 0), axis=0)
    base = start * BLOCK_M
    seen = count * 0
    for c0 in range(0, N_PAIRS, CHUNK):
        p = c0 + tl.arange(0, CHUNK)
        hit = tl.load(ids_ptr + p, mask=p < N_PAIRS, other=-1) == e
        rank = seen + tl.cumsum(hit.to(tl.int32), axis=0) - 1
        tl.store(pairs_ptr + base + rank, p, mask=hit)
        seen += tl.sum(hit.to(tl.int32), axis=0)
    pad = count + tl.arange(0, BLOCK_M)
    tl.store(pairs_ptr + base + pad, tl.zeros((BLOCK_M,), tl.int32) + N_PAIRS, mask=pad < end * BLOCK_M - base)
    for b0 in range(start, end, CHUNK):
        b = b0 + tl.arange(0, CHUNK)
        tl.store(block_expert_ptr + b, tl.full((CHUNK,), 0, tl.int32) + e, mask=b < end)
    if e == E - 1:
        for b0 in range(end, N_BLOCKS, CHUNK):
            b = b0 + tl.arange(0, CHUNK)
            tl.store(block_expert_ptr + b, tl.full((CHUNK,), -1, tl.int32), mask=b < N_BLOCKS)


@triton.jit(do_not_specialize=["M"])
def prefill_combine_kernel(y_ptr, out_ptr, M, H: tl.constexpr, TOPK: tl.constexpr, BLOCK_H: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = offs < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        acc += tl.load(y_ptr + (m * TOPK + j) * H + offs, mask=ok, other=0.0)
    tl.store(out_ptr + m * H + offs, acc.to(tl.bfloat16), mask=ok)


def experts_pad(e: int) -> int:
    """Experts as the kernels' tl.arange holds them: a power of two, at least the router dot's 16 columns."""
    return max(16, triton.next_power_of_2(e))


def router_launch_kwargs(h: int, e: int, top_k: int, has_bias: bool, interpret: bool) -> dict:
    """The router kernel's constexprs and launch options (route launches with them, the AOT build compiles them)."""
    return dict(H=h, E=e, E_PAD=experts_pad(e), TOPK=top_k, HAS_BIAS=has_bias, BLOCK_T=ROUTER_BLOCK_T,
                BLOCK_K=ROUTER_BLOCK_K, INTERPRET=interpret, num_warps=4, num_stages=3)


def align_launch_kwargs(e: int, block_m: int) -> dict:
    return dict(E=e, E_PAD=experts_pad(e), BLOCK_M=block_m, CHUNK=ALIGN_CHUNK, num_warps=4)


def combine_launch_kwargs(h: int, top_k: int) -> dict:
    return dict(H=h, TOPK=top_k, BLOCK_H=COMBINE_BLOCK_H, num_warps=4)


def route(x: torch.Tensor, router_w: torch.Tensor, router_b: torch.Tensor | None, top_k: int
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, H] bf16 -> (ids [M, K] int32, weights [M, K] fp32, counts [E] int32: pairs per expert)."""
    m, h = x.shape
    e = router_w.shape[0]
    x = x.contiguous()
    ids = torch.empty((m, top_k), dtype=torch.int32, device=x.device)
    weights = torch.empty((m, top_k), dtype=torch.float32, device=x.device)
    counts = torch.zeros(e, dtype=torch.int32, device=x.device)
    prefill_router_kernel[(triton.cdiv(m, ROUTER_BLOCK_T),)](
        x, router_w, router_b if router_b is not None else router_w, ids, weights, counts, m, x.stride(0),
        router_w.stride(0), **router_launch_kwargs(h, e, top_k, router_b is not None, interpreting()))
    return ids, weights, counts


def counts_of(ids: torch.Tensor, experts: int) -> torch.Tensor:
    """Pairs per expert of given ids (for callers that route elsewhere); no host sync."""
    flat = ids.reshape(-1).to(torch.int64)
    return torch.zeros(experts, dtype=torch.int32, device=ids.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))


def align(ids: torch.Tensor, counts: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [M, K] int32 and counts [E] -> (pairs [B * block_m] int32, block_expert [B] int32),
    B = cdiv(M K, block_m) + E: as reference.align_pairs_ref, except that pairs past the last used
    block are left unwritten (the kernels skip blocks whose expert is -1)."""
    e = counts.numel()
    n = ids.numel()
    n_blocks = triton.cdiv(n, block_m) + e
    pairs = torch.empty(n_blocks * block_m, dtype=torch.int32, device=ids.device)
    block_expert = torch.empty(n_blocks, dtype=torch.int32, device=ids.device)
    prefill_align_kernel[(e,)](ids.contiguous(), counts, pairs, block_expert, n, n_blocks,
                               **align_launch_kwargs(e, block_m))
    return pairs, block_expert


def combine(y: torch.Tensor, m: int, top_k: int) -> torch.Tensor:
    """y [M*K, H] fp32 -> [M, H] bf16, each token's k rows summed."""
    h = y.shape[1]
    out = torch.empty((m, h), dtype=torch.bfloat16, device=y.device)
    prefill_combine_kernel[(m, triton.cdiv(h, COMBINE_BLOCK_H))](y, out, m, **combine_launch_kwargs(h, top_k))
    return out
