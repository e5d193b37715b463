"""Router GEMM for decode: partial logits[s, m, e] = x[m, ks] . Wr[e, ks] (+ bias in split 0).

Why split K and not rows only: E is 128 (120b) or 32 (20b), so a grid over
experts alone gives 8 or 2 programs, too few to pull the 0.7 MB router weight
at full bandwidth. The SPLIT_K partial sums (fp32, a few KB) are added up
(the bias is in split 0) by whoever takes the top-k: no atomics, no zeroing,
deterministic, no extra launch.

With FUSE_TOPK (from 3 tokens, moe.launch_plan) the last program to finish
does the top-k + softmax (routing.publish_routing) and writes the tables the
expert kernels read. At 1 and 2 tokens the kernel ends after its partials and
every gate_up program takes the top-k itself (moe_gate_up.py, ROUTE).

Why M <= 32 costs the same as M = 1: tokens are the N side of a tensor-core
dot padded to M_PAD (16 or 32) columns, and the weight is read once for all
of them. cuBLAS picks a different, slower kernel at M = 2 (docs/HARDWARE.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import interpreting
from .arrival import last_to_arrive, reset_arrivals
from .mxfp4_decode import dot_bf16
from .pdl import pdl_launch, pdl_launch_next, pdl_wait
from .routing import publish_routing


@triton.jit
def _weight_tile(w_ptr, offs_e, k, k_ok, E, stride_we):
    """Wr[offs_e, k] as bf16 [experts, k]; zero where k_ok is false or the expert is past E."""
    return tl.load(w_ptr + offs_e[:, None] * stride_we + k[None, :], mask=(offs_e[:, None] < E) & k_ok[None, :],
                   other=0.0).to(tl.bfloat16)


@triton.jit
def _x_tile(x_ptr, offs_m, k, k_ok, M, stride_xm):
    """x[offs_m, k] as bf16 [k, token columns]; zero where k_ok is false or the token is past M."""
    return tl.load(x_ptr + offs_m[None, :] * stride_xm + k[:, None], mask=(offs_m[None, :] < M) & k_ok[:, None],
                   other=0.0).to(tl.bfloat16)


@triton.jit(do_not_specialize=["M"])
def router_logits_kernel(
    x_ptr, w_ptr, b_ptr, partial_ptr,
    ids_ptr, weights_ptr, experts_ptr, n_experts_ptr, counter_ptr,
    M, E, K, K_PER_SPLIT,
    stride_xm, stride_we,
    M_PAD: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr = 1, FUSE_TOPK: tl.constexpr = False, TOPK: tl.constexpr = 4, E_PAD: tl.constexpr = 128,
    INTERPRET: tl.constexpr = False, TOPK_ROWS: tl.constexpr = 16, PDL: tl.constexpr = False,
    PRELOAD_K: tl.constexpr = 0,
):
    pid_e = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_e = pid_e * BLOCK_E + tl.arange(0, BLOCK_E)
    offs_m = tl.arange(0, M_PAD)
    acc = tl.zeros((BLOCK_E, M_PAD), dtype=tl.float32)
    k_begin = pid_k * K_PER_SPLIT
    if PRELOAD_K > 0:
        # The program's whole share of K as one tile (PRELOAD_K >= K_PER_SPLIT, launch_kwargs). The
        # weights are parameters, no earlier kernel's output: asked for before the PDL wait, they
        # arrive while the previous layer's down kernel ends, and after the wait only x (in L2) is read.
        offs_k = tl.arange(0, PRELOAD_K)
        k = k_begin + offs_k
        k_ok = (offs_k < K_PER_SPLIT) & (k < K)
        w = _weight_tile(w_ptr, offs_e, k, k_ok, E, stride_we)
        pdl_wait(PDL)  # x is the previous kernel's output
        acc = dot_bf16(w, _x_tile(x_ptr, offs_m, k, k_ok, M, stride_xm), acc, INTERPRET)
    else:
        pdl_wait(PDL)  # x is the previous kernel's output
        offs_k = tl.arange(0, BLOCK_K)
        for k0 in range(k_begin, k_begin + K_PER_SPLIT, BLOCK_K):
            k = k0 + offs_k
            k_ok = k < K
            acc = dot_bf16(_weight_tile(w_ptr, offs_e, k, k_ok, E, stride_we),
                           _x_tile(x_ptr, offs_m, k, k_ok, M, stride_xm), acc, INTERPRET)
    if HAS_BIAS:  # into split 0 only, so the sum over splits adds it once
        bias = tl.load(b_ptr + offs_e, mask=offs_e < E, other=0.0).to(tl.float32)
        acc += tl.where(pid_k == 0, bias, 0.0)[:, None]
    out = partial_ptr + pid_k * M * E + offs_m[None, :] * E + offs_e[:, None]
    tl.store(out, acc, mask=(offs_e[:, None] < E) & (offs_m[None, :] < M))
    pdl_launch_next(PDL)  # the expert kernel's programs get placed during the top-k below
    if FUSE_TOPK:
        # The last program to finish reads every partial and publishes the routing (arrival.py).
        if last_to_arrive(counter_ptr, tl.num_programs(0) * SPLIT_K):
            publish_routing(partial_ptr, ids_ptr, weights_ptr, experts_ptr, n_experts_ptr,
                            M, E, SPLIT_K, TOPK_ROWS, E_PAD, TOPK)
            reset_arrivals(counter_ptr)


def m_pad_for(m: int, min_pad: int = 16) -> int:
    """Token columns of a tensor-core tile for m tokens, at least min_pad: one compiled variant per bucket."""
    if m <= 16:
        return max(min_pad, triton.next_power_of_2(m))
    if m <= 32:
        return 32
    raise ValueError(f"decode kernels take at most 32 tokens, got {m}")


def topk_rows_for(m: int, min_rows: int = 4) -> int:
    """Rows of the top-k's [rows, E] tile: a power of two >= m, at least min_rows. 4 gives each of
    the 4 warps whole rows (a row's reductions stay inside one warp); at M <= 4 the top-k then
    runs a third of the instructions it would over the 16-row tensor-core bucket."""
    return max(min_rows, triton.next_power_of_2(m))


def k_split(k: int, split_k: int, block_k: int) -> tuple[int, int]:
    """(K per program, programs along K) for a K split of about split_k ways in whole BLOCK_K steps."""
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    return k_per_split, triton.cdiv(k, k_per_split)


def router_logits_partial(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, split_k: int = 9,
                          block_e: int = 16, block_k: int = 64, num_warps: int = 4,
                          num_stages: int = 3, out: torch.Tensor | None = None,
                          routing: tuple | None = None, top_k: int = 4, topk_rows: int | None = None,
                          m_pad: int | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M, H] bf16, weight [E, H] bf16, bias [E] -> partial logits fp32 [splits, M, E]; their sum is the logits.

    split_k=1 gives the logits themselves ([1, M, E]) in one launch. routing =
    (ids, weights, experts, n_experts, counter) also publishes the top-k (FUSE_TOPK).
    """
    m, k = x.shape
    e = weight.shape[0]
    k_per_split, split_k = k_split(k, split_k, block_k)
    if out is None:
        out = torch.empty((split_k, m, e), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(e, block_e), split_k)
    ids, weights, experts, n_experts, counter = routing if routing is not None else (out,) * 5
    router_logits_kernel[grid](
        x, weight, bias if bias is not None else weight, out, ids, weights, experts, n_experts, counter,
        m, e, k, k_per_split, x.stride(0), weight.stride(0),
        **launch_kwargs(m, e, bias is not None, split_k, k_per_split, routing is not None, top_k, block_e, block_k,
                        topk_rows, m_pad, num_warps, num_stages, pdl, interpreting()))
    return out


# Largest share of K (rounded up to a power of two) a program loads as one tile before its PDL
# wait: 16 experts x 256 bf16 = 8 KB, 16 registers per thread of 4 warps. Decode's split (15
# shares of 192) fits; one program over the whole of K (ops.router_logits) loops.
PRELOAD_MAX_K = 256


def launch_kwargs(m: int, e: int, has_bias: bool, split_k: int, k_per_split: int, fuse_topk: bool, top_k: int = 4,
                  block_e: int = 16, block_k: int = 64, topk_rows: int | None = None, m_pad: int | None = None,
                  num_warps: int = 4, num_stages: int = 3, pdl: bool = False, interpret: bool = False) -> dict:
    """router_logits_kernel's constexprs and launch options for m tokens and split_k programs of
    k_per_split along K (k_split).

    router_logits_partial launches with them and aot.compile_variants compiles them, so the
    compile-only check builds exactly the binary that runs.
    """
    preload_k = triton.next_power_of_2(k_per_split)
    return dict(M_PAD=m_pad or m_pad_for(m), BLOCK_E=block_e, BLOCK_K=block_k, HAS_BIAS=has_bias, SPLIT_K=split_k,
                PRELOAD_K=preload_k if preload_k <= PRELOAD_MAX_K else 0,
                FUSE_TOPK=fuse_topk, TOPK=top_k, E_PAD=triton.next_power_of_2(e), INTERPRET=interpret,
                TOPK_ROWS=topk_rows or topk_rows_for(m), num_warps=num_warps, num_stages=num_stages,
                **pdl_launch(pdl))


def router_logits_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """What router_logits_partial(...).sum(0) must equal (fp32 accumulation of bf16 inputs)."""
    logits = x.float() @ weight.float().T
    return logits + bias.float() if bias is not None else logits
