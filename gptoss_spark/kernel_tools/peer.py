"""OpenAI's triton_kernels as the peer of our MoE layer, driven the way vLLM 0.32.0 drives it.

The peer is not part of this project: the benchmark takes the path of a triton_kernels
checkout (the `python/triton_kernels` folder of the Triton release that matches the
installed Triton) and imports it from there. What is mirrored from vLLM, so the
comparison is the one an engine would make:

- weights (vLLM's quantization/utils/mxfp4_utils._swizzle_mxfp4): each expert's MXFP4
  blocks and e8m0 scales transposed so the quantized axis is dim 1, the values in
  triton_kernels' default MXFP4 value layout, the scales in its scale layout for
  `num_warps` (vLLM passes 8). On Hopper vLLM pins split_k = 1 and pads the scales' K
  groups to a multiple of 4; both are done here too. Biases in fp32.
- routing (vLLM's gpt_oss_triton_kernels_moe.triton_kernel_moe_forward): the router as
  a bf16 linear, triton_kernels' topk with the softmax over the selected 4, and its
  sparse-matrix metadata turned into RoutingData / GatherIndx / ScatterIndx.
- experts: matmul_ogs for gate_up with the gather and a fused SwiGLU (alpha 1.702,
  limit 7.0, reduction_n = 2), then matmul_ogs for down with the scatter and the
  routing weights as gammas.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from ..base.errors import UserError

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0


class PeerError(UserError):
    """The peer's path is not a triton_kernels checkout."""


def load(path: Path) -> SimpleNamespace:
    """Import triton_kernels from `path` (the folder that holds the triton_kernels package)."""
    path = Path(path).resolve()
    if not (path / "triton_kernels" / "matmul_ogs.py").is_file():
        raise PeerError(f"{path} has no triton_kernels/matmul_ogs.py: pass the folder that holds the "
                        f"triton_kernels package (Triton's python/triton_kernels)")
    sys.path.insert(0, str(path))
    # Every name imported below is handed back as one namespace (locals()), so a missing one fails here.
    from triton_kernels import swiglu
    from triton_kernels.matmul_ogs import (FlexCtx, FnSpecs, FusedActivation, GatherIndx, PrecisionConfig,
                                           RoutingData, ScatterIndx, matmul_ogs)
    from triton_kernels.matmul_ogs_details import opt_flags
    from triton_kernels.numerics import InFlexData
    from triton_kernels.tensor import FP4, convert_layout, make_ragged_tensor_metadata, wrap_torch_tensor
    from triton_kernels.tensor_details import layout
    from triton_kernels.topk import topk
    version = _version(path)
    return SimpleNamespace(**locals())


def _version(path: Path) -> str:
    meta = path / "pyproject.toml"
    if meta.is_file():
        for line in meta.read_text().splitlines():
            if line.strip().startswith("version"):
                return line.split("=", 1)[1].strip().strip('"\'')
    return "unknown"


def swizzle(tk, blocks: torch.Tensor, scales: torch.Tensor, num_warps: int):
    """vLLM's _swizzle_mxfp4 on CUDA: [E, N, K/2] u8 + [E, N, K/32] u8 -> triton_kernels tensors."""
    value_layout, value_opts = tk.layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    scale_layout, scale_opts = tk.layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=num_warps)
    if torch.cuda.get_device_capability()[0] == 9:
        tk.opt_flags.update_opt_flags_constraints({"split_k": 1})
        scales = torch.nn.functional.pad(scales, (0, -scales.shape[-1] % 4))
    elif torch.cuda.get_device_capability()[0] in (10, 12):
        tk.opt_flags.update_opt_flags_constraints({"is_persistent": True, "epilogue_subtile": 1})
    w = tk.convert_layout(tk.wrap_torch_tensor(blocks.transpose(-2, -1), dtype=tk.FP4), value_layout, **value_opts)
    s = tk.convert_layout(tk.wrap_torch_tensor(scales.transpose(-2, -1)), scale_layout, **scale_opts)
    return w, s


class PeerLayer:
    """One MoE layer on triton_kernels (`tk`, from load()), from a benchmark.Layer's checkpoint-layout weights."""

    def __init__(self, tk: SimpleNamespace, layer, num_warps: int = 8, top_k: int = 4):
        self.tk = tk
        self.top_k = top_k
        self.rw, self.rb = layer.rw, layer.rb
        self.n_experts = layer.rw.shape[0]
        w13, s13 = swizzle(tk, layer.w13, layer.s13, num_warps)
        w2, s2 = swizzle(tk, layer.w2, layer.s2, num_warps)
        self.w13, self.w2 = w13, w2
        self.b13, self.b2 = layer.b13.float(), layer.b2.float()
        self.pc13 = tk.PrecisionConfig(weight_scale=s13, flex_ctx=tk.FlexCtx(rhs_data=tk.InFlexData()))
        self.pc2 = tk.PrecisionConfig(weight_scale=s2, flex_ctx=tk.FlexCtx(rhs_data=tk.InFlexData()))
        self.act = tk.FusedActivation(tk.FnSpecs("swiglu", tk.swiglu.swiglu_fn, ("alpha", "limit"), reduction_n=2),
                                      (SWIGLU_ALPHA, SWIGLU_LIMIT))

    def routing(self, x: torch.Tensor):
        tk = self.tk
        logits = torch.nn.functional.linear(x, self.rw, self.rb)
        sparse = tk.topk(logits, self.top_k, apply_softmax=True)
        dispatch = sparse.mask_metadata.row_sorted_indx
        combine = sparse.mask_metadata.col_sorted_indx
        ragged = tk.make_ragged_tensor_metadata(sparse.mask_metadata.col_sum, dispatch.shape[0])
        gate_scal = sparse.vals.flatten()[combine]
        rdata = tk.RoutingData(gate_scal, ragged.slice_sizes, self.n_experts, self.top_k, ragged)
        return rdata, tk.GatherIndx(combine, dispatch), tk.ScatterIndx(dispatch, combine)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        tk = self.tk
        rdata, gather, scatter = self.routing(x)
        h = tk.matmul_ogs(x, self.w13, self.b13, rdata, gather_indx=gather, precision_config=self.pc13,
                          fused_activation=self.act)
        return tk.matmul_ogs(h, self.w2, self.b2, rdata, scatter_indx=scatter, precision_config=self.pc2,
                             gammas=rdata.gate_scal)
