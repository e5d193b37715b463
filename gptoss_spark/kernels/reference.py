"""Torch reference of the gpt-oss MoE block (router, top-k, experts), beside the Triton kernels.

Semantics follow the gpt-oss model as vLLM and transformers run it:
  logits = x @ Wr^T + br;  top-k experts per token; weights = softmax over the k selected logits;
  gate_up = x @ W13_e^T + b13_e  with rows interleaved: row 2j is gate j, row 2j+1 is up j;
  gate = min(gate, 7.0); up = clamp(up, -7.0, 7.0); h = (up + 1) * gate * sigmoid(1.702 * gate);
  y = sum_k weight_k * (h_k @ W2_e^T + b2_e).
Experts are dequantized from MXFP4 exactly (gptoss_spark.mxfp4; every value is a bf16) and
multiplied with bf16 operands and fp32 accumulation, as the tensor cores do; h is rounded to bf16
between the two GEMMs, as in the kernels and in vLLM. The router is computed in fp32 so the reference's top-k does
not flip on bf16 rounding ties.
"""

from __future__ import annotations

import torch

from ..mxfp4 import dequantize_mxfp4

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0


def router_logits_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    logits = x.float() @ weight.float().T
    return logits + bias.float() if bias is not None else logits


def topk_softmax_ref(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    values, ids = torch.topk(logits.float(), top_k, dim=-1)
    return ids.to(torch.int32), torch.softmax(values, dim=-1)


def swiglu_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate = gate_up[..., 0::2].float().clamp(max=SWIGLU_LIMIT)
    up = gate_up[..., 1::2].float().clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    return (up + 1.0) * gate * torch.sigmoid(SWIGLU_ALPHA * gate)


def experts_ref(x, topk_ids, topk_weights, w13, s13, b13, w2, s2, b2) -> torch.Tensor:
    """x [M, H] bf16; w13 [E, 2I, H/2] u8, s13 [E, 2I, H/32]; w2 [E, H, I/2], s2 [E, H, I/32]; biases [E, *] or None."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in topk_ids.unique().tolist():
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        gate_up = x[rows].float() @ dequantize_mxfp4(w13[e], s13[e]).T
        if b13 is not None:
            gate_up = gate_up + b13[e].float()
        h = swiglu_ref(gate_up).to(torch.bfloat16)  # the kernels keep h in bf16 too
        y = h.float() @ dequantize_mxfp4(w2[e], s2[e]).T
        if b2 is not None:
            y = y + b2[e].float()
        out.index_add_(0, rows, y * topk_weights[rows, slots, None].float())
    return out.to(torch.bfloat16)


def moe_block_ref(x, router_w, router_b, w13, s13, b13, w2, s2, b2, top_k: int) -> torch.Tensor:
    ids, weights = topk_softmax_ref(router_logits_ref(x, router_w, router_b), top_k)
    return experts_ref(x, ids, weights, w13, s13, b13, w2, s2, b2)


def align_pairs_ref(ids: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill kernels' block tables (prefill_routing.align computes them on the GPU).

    Top-k ids [M, K] -> (pairs [B * block_m] int32, block_expert [B] int32), B = cdiv(M K, block_m) + E.

    Pair p = m * K + k. Each expert's pairs fill whole blocks (the last one padded with
    M K, which the kernels skip), in token order; block_expert[b] is the expert of block b,
    -1 for the blocks past the last used one. B bounds sum_e cdiv(count_e, block_m)
    without reading the counts on the host.
    """
    flat = ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    dev = flat.device
    n_blocks = -(-n // block_m) + experts
    counts = torch.zeros(experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    blocks = (counts + block_m - 1) // block_m
    blocks_end = torch.cumsum(blocks, 0)
    order = torch.argsort(flat, stable=True)          # pairs by expert, token order within one
    sorted_e = flat[order]
    first = torch.cumsum(counts, 0) - counts          # where expert e starts in that order
    rank = torch.arange(n, device=dev) - first[sorted_e]
    slot = (blocks_end - blocks)[sorted_e] * block_m + rank
    pairs = torch.full((n_blocks * block_m,), n, dtype=torch.int32, device=dev)
    pairs[slot] = order.to(torch.int32)
    owner = torch.searchsorted(blocks_end, torch.arange(n_blocks, device=dev), right=True)
    block_expert = torch.where(owner < experts, owner, -1).to(torch.int32)
    return pairs, block_expert
