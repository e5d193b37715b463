"""MXFP4 (OCP MX: e2m1 values, one E8M0 scale per 32 along K) in plain torch: the repo's one quantizer.

Every user quantizes and dequantizes here: the demo model's experts (install/demo_model.py),
the kernels' torch reference and baselines (kernels/reference.py, kernel_tools/benchmark.py,
benchmarks/kernels/), the lm_head quality benchmark (benchmarks/lm_head_quality/) and the tests.
It runs anywhere torch runs (CPU in CI).

Why this rule: it is bit-exact with vLLM 0.32.0's ``downcast_to_mxfp``
(model_executor/layers/quantization/utils/mxfp4_utils.py), the quantizer behind vLLM's
``mxfp4_quantize``: what the lm_head patch (patches/vllm/02-*) and vLLM's online MXFP4
linears (qkv/o, an online-quantized drafter) run on the GPU. The gpt-oss checkpoints ship
their experts already quantized (``*_blocks``/``*_scales``) and vLLM loads those bytes as
they are, so vLLM's quantizer is the only one the served engine ever runs; matching it byte
for byte means a model quantized here (the demo model) holds what vLLM itself would make,
and the tests check both give the same bytes (tests/unit/test_mxfp4_upstream.py runs vLLM's
kernel under Triton's interpreter). The other common rule, a scale of 2**ceil(log2(amax / 6))
so that the block max never saturates (the default of OpenAI's triton_kernels
``downcast_to_mxfp``, which the repo's kernel tests used to quantize with), picks a
scale twice as large whenever amax's mantissa lies in (1.5, 1.75) (22 to 28 % of the
blocks of Gaussian and Student-t weights at 4096 x 2880), which costs 6-8 % more weight
error (docs/PATCHES.md, "lm_head quality under MXFP4"); the old test helper also rounded
value ties toward zero.

Layout (what ``prepare_fp4_layer_for_marlin`` in vLLM 0.32.0 takes, and the
gpt-oss checkpoint's ``*_blocks``/``*_scales`` flattened):
  packed  uint8 [..., N, K/2]  element k=2i in the low nibble of byte i, k=2i+1 in the high
                               nibble; ``packed.view(int32)`` then holds k=8j..8j+7 in
                               nibbles 0..7 of int32 j (GPTQ order, the input of
                               ``gptq_marlin_repack`` after its ``.T``)
  scales  uint8 [..., N, K/32] E8M0: the block's scale is 2**(byte - 127)
The Triton kernels read a repack of it (kernels/mxfp4_layout.py), not these tensors.

Rules (bit-exact with vLLM 0.32.0's ``downcast_to_mxfp``):
  scale   amax = max |x| over the 32 values. Round amax to e2m1 precision first (to the
          next power of two when its mantissa is >= 1.75, the midpoint between 1.5*2^e,
          which 6.0 can hold, and 2*2^e, which would clip), then
          E = floor(log2(amax_rounded)) - 2, clamped to [-127, 127] (an amax that rounds
          past float32's range gets E = 127, as vLLM's kernel does). An all-zero block,
          and any block whose amax is below 2**-126, gets E = -127 (byte 0).
  values  x / 2**E rounded to the nearest of {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to the even
          code, saturating at 6; the sign bit is x's (so -0.0 and small negatives give
          code 8, "-0").
  subnormal blocks (amax < 2**-126, only reachable from denormal inputs): values are
          rounded exactly against 2**-127 here; vLLM's Triton kernel leaves them to the
          device's denormal handling, so bytes may differ there (never in real weights).
  inf/nan refused (ValueError): a non-finite weight is a broken checkpoint, and the
          GPU kernel would silently turn it into +-6 * 2**127.
"""

from __future__ import annotations

import torch

BLOCK = 32  # values per E8M0 scale
E8M0_BIAS = 127
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7; code | 8 is the negative
# Rounding thresholds on |x|/scale: (threshold, inclusive). At a tie the even code wins:
# 0.25 -> 0 (down), 0.75 -> 1.0 (up), 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0.
_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))
DEFAULT_CHUNK_ROWS = 4096  # bounds the fp32 temporaries: 4096 x 2880 x 4 B = 47 MB each

_LUTS: dict[torch.device, torch.Tensor] = {}


def _lut(device: torch.device) -> torch.Tensor:
    """Code -> value, float32 [16]. Cached per device: dequantizing inside a CUDA-graph capture
    (the benchmarks' torch baseline) must not copy a new table from the host."""
    if device not in _LUTS:
        _LUTS[device] = torch.tensor(E2M1_GRID + tuple(-v for v in E2M1_GRID), dtype=torch.float32, device=device)
    return _LUTS[device]


def _check(w: torch.Tensor) -> None:
    if not w.is_floating_point():
        raise ValueError(f"MXFP4 quantization takes a float tensor, got {w.dtype}")
    if w.dim() < 1 or w.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 quantization needs the last dimension to be a multiple of {BLOCK}, "
                         f"got shape {tuple(w.shape)}")


def scale_exponents(blocks: torch.Tensor) -> torch.Tensor:
    """float32 [..., B, 32] -> int32 [..., B]: unbiased E8M0 exponent per block."""
    amax = blocks.abs().amax(dim=-1)
    bits = amax.view(torch.int32)
    # Round the mantissa at its 2nd bit below the point (0x200000 = 0.25 ulp of 1.x): a
    # mantissa >= .75 carries into the exponent. Then keep the exponent field only.
    rounded = ((bits + 0x200000) & 0x7F800000).view(torch.float32)
    # floor(log2) of a power of two (or of 0 / a denormal, whose exponent field is 0).
    exp_field = (rounded.view(torch.int32) >> 23)
    unbiased = torch.where(exp_field == 0, torch.full_like(exp_field, -126), exp_field - 127)
    e = (unbiased - 2).clamp_(-127, 127)
    # amax >= 1.75 * 2**127 rounds to infinity; vLLM's kernel then takes log2(inf) = inf and
    # clamps to 127. Same bytes here (and both decode to the same values).
    return torch.where(exp_field == 255, torch.full_like(e, 127), e)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """int32 exponents in [-149, 127] -> exactly 2**e as float32 (built from bits, no libm)."""
    e = e.to(torch.int32)
    normal = (e + 127).clamp(min=1) << 23
    denormal = torch.ones_like(e) << (e + 149).clamp(0, 22)
    return torch.where(e >= -126, normal, denormal).view(torch.float32)


def _encode(scaled: torch.Tensor) -> torch.Tensor:
    a = scaled.abs()
    code = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    for t, inclusive in _THRESHOLDS:
        code += (a >= t) if inclusive else (a > t)
    return code | (torch.signbit(scaled).to(torch.uint8) << 3)


def quantize_mxfp4(w: torch.Tensor, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] float -> (packed uint8 [..., N, K/2], scales uint8 [..., N, K/32])."""
    _check(w)
    if not bool(torch.isfinite(w).all()):
        bad = int((~torch.isfinite(w)).sum())
        raise ValueError(f"MXFP4 quantization refuses non-finite input ({bad} inf/nan values); "
                         "the weight is corrupt - re-download the checkpoint")
    k = w.shape[-1]
    rows = w.reshape(-1, k)
    packed = torch.empty((rows.shape[0], k // 2), dtype=torch.uint8, device=w.device)
    scales = torch.empty((rows.shape[0], k // BLOCK), dtype=torch.uint8, device=w.device)
    for start in range(0, rows.shape[0], max(1, chunk_rows)):
        part = rows[start:start + chunk_rows].to(torch.float32).reshape(-1, k // BLOCK, BLOCK)
        e = scale_exponents(part)
        # 2**-E as a float32 power of two; E >= -127 so 2**-E <= 2**127 is finite.
        inv = pow2(-e)
        codes = _encode(part * inv.unsqueeze(-1)).reshape(part.shape[0], k)
        packed[start:start + chunk_rows] = codes[:, 0::2] | (codes[:, 1::2] << 4)
        scales[start:start + chunk_rows] = (e + E8M0_BIAS).to(torch.uint8)
    return packed.reshape(*w.shape[:-1], k // 2), scales.reshape(*w.shape[:-1], k // BLOCK)


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32,
                     chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """(packed uint8 [..., N, K/2], scales uint8 [..., N, K/32]) -> [..., N, K] of ``dtype``.

    Exact in float32 (every e2m1 value times a power of two is representable) except
    where 2**(s-127) * value leaves float32's range; bf16 output rounds only there too.
    """
    if packed.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 dequantization takes uint8 packed values and scales, got {packed.dtype}/{scales.dtype}")
    k = packed.shape[-1] * 2
    if scales.shape[:-1] != packed.shape[:-1] or scales.shape[-1] * BLOCK != k:
        raise ValueError(f"packed {tuple(packed.shape)} and scales {tuple(scales.shape)} do not describe one "
                         f"[..., N, K] matrix (need scales [..., N, K/32] for packed [..., N, K/2])")
    lut = _lut(packed.device)
    p_rows = packed.reshape(-1, k // 2)
    s_rows = scales.reshape(-1, k // BLOCK)
    out = torch.empty((p_rows.shape[0], k), dtype=dtype, device=packed.device)
    for start in range(0, p_rows.shape[0], max(1, chunk_rows)):
        p = p_rows[start:start + chunk_rows]
        vals = torch.stack((lut[(p & 0x0F).long()], lut[(p >> 4).long()]), dim=-1).reshape(p.shape[0], -1, BLOCK)
        e = s_rows[start:start + chunk_rows].to(torch.int32) - E8M0_BIAS
        out[start:start + chunk_rows] = (vals * pow2(e).unsqueeze(-1)).reshape(p.shape[0], k).to(dtype)
    return out.reshape(*packed.shape[:-1], k)


def random_mxfp4(shape_nk: tuple[int, ...], *, device="cpu", generator=None,
                 scale_exp: tuple[int, int] = (118, 124)) -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed [..., N, K/2] and scales [..., N, K/32] for tests and benchmarks: every code
    drawn, scale bytes in scale_exp (inclusive; the default gives |w| ~ 1e-2, gpt-oss's magnitude)."""
    *lead, n, k = shape_nk
    packed = torch.randint(0, 256, (*lead, n, k // 2), dtype=torch.uint8, device=device, generator=generator)
    scales = torch.randint(scale_exp[0], scale_exp[1] + 1, (*lead, n, k // BLOCK),
                           dtype=torch.uint8, device=device, generator=generator)
    return packed, scales
