"""Torch reference of the gpt-oss MoE block (router, top-k, experts), beside the Triton kernels.

Semantics follow the gpt-oss model as vLLM and transformers run it:
  logits = x @ Wr^T + br;  top-k experts per token; weights = softmax over the k selected logits;
  gate_up = x @ W13_e^T + b13_e  with rows interleaved: row 2j is gate j, row 2j+1 is up j;
  gate = min(gate, 7.0); up = clamp(up, -7.0, 7.0); h = (up + 1) * gate * sigmoid(1.702 * gate);
  y = sum_k weight_k * (h_k @ W2_e^T + b2_e).
Experts are dequantized from MXFP4 to bf16 (exact) and multiplied with bf16
operands and fp32 accumulation, as the tensor cores do; h is rounded to bf16
between the two GEMMs, as in the kernels and in vLLM. The router is computed in fp32 so the reference's top-k does
not flip on bf16 rounding ties.
"""

from __future__ import annotations

import torch

from .mxfp4 import dequantize

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
        gate_up = x[rows].float() @ dequantize(w13[e], s13[e]).float().T
        if b13 is not None:
            gate_up = gate_up + b13[e].float()
        h = swiglu_ref(gate_up).to(torch.bfloat16)  # the kernels keep h in bf16 too
        y = h.float() @ dequantize(w2[e], s2[e]).float().T
        if b2 is not None:
            y = y + b2[e].float()
        out.index_add_(0, rows, y * topk_weights[rows, slots, None].float())
    return out.to(torch.bfloat16)


def moe_block_ref(x, router_w, router_b, w13, s13, b13, w2, s2, b2, top_k: int) -> torch.Tensor:
    ids, weights = topk_softmax_ref(router_logits_ref(x, router_w, router_b), top_k)
    return experts_ref(x, ids, weights, w13, s13, b13, w2, s2, b2)
