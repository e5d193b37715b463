"""MXFP4 (OCP microscaling, e2m1 values + e8m0 scales) in plain torch.

The gpt-oss checkpoint stores each expert matrix W[N, K] as
  blocks uint8 [N, K/32, 16]: two e2m1 values per byte, the first (even k) in the low nibble;
  scales uint8 [N, K/32]:     e8m0, one power of two 2**(s-127) per 32 consecutive k.
Flattening blocks gives [N, K/2], packed along K. The kernels read a repack of
it (mxfp4_layout.py); these helpers are the reference side, on the checkpoint
layout: the kernels never call them.
"""

from __future__ import annotations

import torch

MXFP4_BLOCK = 32  # weights per e8m0 scale
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


_LUTS: dict[torch.device, torch.Tensor] = {}


def _lut(device: torch.device) -> torch.Tensor:
    # Cached per device: creating it inside a CUDA-graph capture would be a host copy.
    if device not in _LUTS:
        _LUTS[device] = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return _LUTS[device]


def dequantize(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """packed uint8 [..., N, K/2] (or [..., N, K/32, 16]) + scales uint8 [..., N, K/32] -> [..., N, K]."""
    if packed.dim() == scales.dim() + 1:  # checkpoint form [..., N, K/32, 16]
        packed = packed.flatten(-2)
    lut = _lut(packed.device)
    lo = lut[(packed & 0x0F).long()]
    hi = lut[(packed >> 4).long()]
    values = torch.stack((lo, hi), dim=-1).flatten(-2)  # [..., N, K], even k from the low nibble
    factor = torch.exp2(scales.float() - 127.0).repeat_interleave(MXFP4_BLOCK, dim=-1)
    return (values * factor).to(dtype)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] float -> (packed uint8 [..., N, K/2], scales uint8 [..., N, K/32]). For tests and benchmarks.

    Round-to-nearest onto the e2m1 grid with the block's scale chosen so the
    block maximum maps to at most 6.0 (the usual MX recipe).
    """
    *lead, n, k = w.shape
    assert k % MXFP4_BLOCK == 0, "K must be a multiple of 32"
    blocks = w.float().reshape(*lead, n, k // MXFP4_BLOCK, MXFP4_BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True).clamp_min(2.0**-100)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = blocks / torch.exp2(exp)
    grid = torch.tensor(E2M1_VALUES[:8], device=w.device)
    idx = (scaled.abs().unsqueeze(-1) - grid).abs().argmin(dim=-1)
    codes = (idx | (scaled < 0).long() << 3).to(torch.uint8).reshape(*lead, n, k)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = (exp.squeeze(-1) + 127).to(torch.uint8)
    return packed.contiguous(), scales.contiguous()


def random_mxfp4(shape_nk: tuple[int, ...], *, device="cpu", generator=None,
                 scale_exp: tuple[int, int] = (118, 124)) -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed weights and scales of a realistic magnitude (|w| ~ 1e-2), every code drawn."""
    *lead, n, k = shape_nk
    packed = torch.randint(0, 256, (*lead, n, k // 2), dtype=torch.uint8, device=device, generator=generator)
    scales = torch.randint(scale_exp[0], scale_exp[1] + 1, (*lead, n, k // MXFP4_BLOCK),
                           dtype=torch.uint8, device=device, generator=generator)
    return packed, scales
