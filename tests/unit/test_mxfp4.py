"""gptoss_spark.mxfp4 against a straightforward scalar reference, edge cases, and Marlin's layout."""

from __future__ import annotations

import math

import pytest
import torch

from gptoss_spark.mxfp4 import BLOCK, E2M1_GRID, dequantize_mxfp4, pow2, quantize_mxfp4


# ---- the scalar reference: one Python float at a time, written from the OCP MX rules ----

def ref_scale_exponent(block: list[float]) -> int:
    amax = max(abs(v) for v in block)
    if amax < 2.0**-126:  # zero, or only float32 denormals
        return -127
    m, e = math.frexp(amax)  # amax = m * 2**e, 0.5 <= m < 1 -> floor(log2 amax) = e - 1
    floor_log2 = e - 1
    if 2 * m >= 1.75:  # amax rounded to e2m1 precision (1.5 < 1.75 < 2) crosses the next power of two
        floor_log2 += 1
    if floor_log2 > 127:  # rounded past float32's range: vLLM's kernel clamps log2(inf) to 127
        return 127
    return max(-127, min(127, floor_log2 - 2))


def ref_code(v: float, e: int) -> int:
    a = abs(v) / 2.0**e  # exact: a power-of-two scale
    best = min(range(8), key=lambda c: (abs(a - E2M1_GRID[c]), c % 2))  # nearest; at a tie, the even code
    return best | (8 if math.copysign(1.0, v) < 0 else 0)


def ref_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = w.float().reshape(-1, w.shape[-1]).tolist()
    packed, scales = [], []
    for row in rows:
        prow, srow = [], []
        for b in range(0, len(row), BLOCK):
            block = row[b:b + BLOCK]
            e = ref_scale_exponent(block)
            srow.append(e + 127)
            codes = [ref_code(v, e) for v in block]
            prow += [codes[i] | (codes[i + 1] << 4) for i in range(0, BLOCK, 2)]
        packed.append(prow)
        scales.append(srow)
    k = w.shape[-1]
    return (torch.tensor(packed, dtype=torch.uint8).reshape(*w.shape[:-1], k // 2),
            torch.tensor(scales, dtype=torch.uint8).reshape(*w.shape[:-1], k // BLOCK))


def assert_same(w: torch.Tensor) -> None:
    q, s = quantize_mxfp4(w)
    rq, rs = ref_quantize(w)
    assert torch.equal(s, rs), f"scales differ at {(s != rs).nonzero()[:5].tolist()}"
    assert torch.equal(q, rq), f"packed values differ at {(q != rq).nonzero()[:5].tolist()}"


# ---- against the reference ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("std", [1e-3, 0.02, 1.0, 300.0])
def test_random_matches_reference(dtype, std):
    g = torch.Generator().manual_seed(int(std * 1000) + 7)
    w = (torch.randn(12, 96, generator=g) * std).to(dtype)
    assert_same(w)


def test_heavy_tailed_and_3d_matches_reference():
    g = torch.Generator().manual_seed(3)
    w = torch.distributions.StudentT(2.0).sample((2, 5, 64)) * 0.05
    w[0, 0, :7] = torch.randn(7, generator=g) * 40  # an outlier per block drives its scale
    assert_same(w.to(torch.bfloat16))
    q, s = quantize_mxfp4(w)
    assert q.shape == (2, 5, 32) and s.shape == (2, 5, 2)


def test_chunking_does_not_change_the_result():
    w = torch.randn(37, 64) * 0.1
    q1, s1 = quantize_mxfp4(w, chunk_rows=4)
    q2, s2 = quantize_mxfp4(w, chunk_rows=10_000)
    assert torch.equal(q1, q2) and torch.equal(s1, s2)


# ---- e2m1 rounding ----

def test_every_midpoint_ties_to_even_code_and_saturates():
    # Block scale 2**0: amax 6.0 -> mantissa 1.5 -> E = floor(log2 6) - 2 = 0.
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    want = [0, 2, 2, 4, 4, 6, 6]  # codes of 0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0
    vals = mids + [6.0, 0.26, 0.74, 5.01, 0.5, 3.0] + [0.0] * (BLOCK - 13)
    q, s = quantize_mxfp4(torch.tensor([vals]))
    assert int(s[0, 0]) == 127
    codes = torch.stack((q[0] & 15, q[0] >> 4), -1).flatten().tolist()
    assert codes[:7] == want
    assert codes[7:13] == [7, 1, 1, 7, 1, 5]  # 6.0, 0.26->0.5, 0.74->0.5, 5.01->6.0, 0.5, 3.0
    # mantissa 1.75 * 2**2 = 7.0 pushes the scale up: E = 1, 7.0/2 = 3.5 -> 4.0 (code 6)
    q, s = quantize_mxfp4(torch.tensor([[7.0] + [0.0] * 31]))
    assert int(s[0, 0]) == 128 and int(q[0, 0] & 15) == 6
    # just below: 6.99 keeps E = 0 and saturates to 6.0 (code 7)
    q, s = quantize_mxfp4(torch.tensor([[6.99] + [0.0] * 31]))
    assert int(s[0, 0]) == 127 and int(q[0, 0] & 15) == 7


def test_values_on_the_grid_round_trip_exactly():
    g = torch.Generator().manual_seed(1)
    grid = torch.tensor(E2M1_GRID)
    codes = torch.randint(0, 8, (16, 64), generator=g)
    signs = torch.where(torch.rand(16, 64, generator=g) < 0.5, -1.0, 1.0)
    exps = torch.randint(-20, 20, (16, 2), generator=g)
    w = grid[codes] * signs * pow2(exps).repeat_interleave(BLOCK, dim=1)
    w[:, 0] = 6.0 * pow2(exps[:, 0])  # pin each first block's max so its scale is the drawn one
    w[:, BLOCK] = -6.0 * pow2(exps[:, 1])
    q, s = quantize_mxfp4(w)
    assert torch.equal(s.long() - 127, exps.long())
    assert torch.equal(dequantize_mxfp4(q, s), w)


# ---- edge cases and policy ----

def test_zero_blocks_get_scale_byte_zero_and_zero_codes():
    w = torch.zeros(2, 64)
    w[1, 40] = -0.0
    q, s = quantize_mxfp4(w)
    assert torch.equal(s, torch.zeros_like(s))
    assert int(q[1, 20]) == 0x08  # -0.0 keeps its sign bit, like vLLM's kernel
    assert torch.equal(dequantize_mxfp4(q, s), torch.zeros(2, 64))


def test_extreme_magnitudes_match_reference():
    w = torch.zeros(4, 64)
    w[0, :32] = torch.finfo(torch.float32).max        # amax rounds past float32: E = 127
    w[0, 32:] = 1.7e38
    w[1, :32] = torch.finfo(torch.bfloat16).max
    w[2, :32] = torch.tensor(1e-40)                   # float32 denormals: E = -127
    w[2, 32:] = torch.linspace(-3e-38, 3e-38, 32)     # straddles the denormal boundary
    w[3, :32] = 2.0**-125
    assert_same(w)
    q, s = quantize_mxfp4(w)
    assert int(s[0, 0]) == 254 and int(s[2, 0]) == 0
    d = dequantize_mxfp4(q, s)
    assert torch.isfinite(d[2:]).all()
    # Near float32's top, 1.99 * 2**127 rounds to 2.0 * 2**127 = 2**128: the format itself
    # cannot hold it (no real weight is within 30 orders of magnitude of this).
    assert torch.isinf(d[1, 0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_is_refused(bad):
    w = torch.zeros(3, 64)
    w[2, 9] = bad
    with pytest.raises(ValueError, match="non-finite"):
        quantize_mxfp4(w)


def test_shape_and_dtype_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.zeros(2, 48))
    with pytest.raises(ValueError, match="float tensor"):
        quantize_mxfp4(torch.zeros(2, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="one .* matrix"):
        dequantize_mxfp4(torch.zeros(2, 32, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8))


# ---- the layout Marlin's preparation takes (vLLM 0.32.0 prepare_fp4_layer_for_marlin) ----

def test_packing_is_the_gptq_order_marlin_repack_reads():
    # prepare_fp4_layer_for_marlin does qweight = weight.view(int32).T, i.e. [K/8, N] with
    # element k = 8j + t of row n in nibble t of qweight[j, n] (little-endian bytes).
    g = torch.Generator().manual_seed(5)
    n, k = 6, 128
    w = torch.randn(n, k, generator=g)
    q, s = quantize_mxfp4(w)
    assert q.shape == (n, k // 2) and q.dtype == torch.uint8 and q.is_contiguous()
    codes = torch.tensor([[ref_code(float(w[r, c]), int(s[r, c // BLOCK]) - 127) for c in range(k)] for r in range(n)])
    qweight = q.view(torch.int32).T
    assert qweight.shape == (k // 8, n)
    for j in range(k // 8):
        for col in range(n):
            word = int(qweight[j, col]) & 0xFFFFFFFF
            assert [(word >> (4 * t)) & 0xF for t in range(8)] == codes[col, 8 * j:8 * j + 8].tolist()


def test_scales_are_e8m0_as_marlin_reads_them():
    # Marlin's preparation does weight_scale.T.view(float8_e8m0fnu).to(param_dtype).
    w = torch.randn(5, 256) * torch.logspace(-6, 3, 5).unsqueeze(1)
    q, s = quantize_mxfp4(w)
    as_e8m0 = s.view(torch.float8_e8m0fnu).to(torch.float32)
    assert torch.equal(as_e8m0, pow2(s.to(torch.int32) - 127))
    blocks = w.reshape(5, -1, BLOCK).abs().amax(-1)
    assert ((blocks / as_e8m0) <= 7.0).all()  # the block max lands within e2m1's reach (<= 6, or 7 -> rounds up a scale)


def test_dequantize_reads_the_checkpoint_convention():
    # One byte 0x21: low nibble 1 (0.5) is k=0, high nibble 2 (1.0) is k=1; scale byte 128 = x2.
    packed = torch.full((1, 16), 0x21, dtype=torch.uint8)
    scales = torch.tensor([[128]], dtype=torch.uint8)
    out = dequantize_mxfp4(packed, scales)
    assert out[0, :4].tolist() == [1.0, 2.0, 1.0, 2.0]


def test_dequantize_matches_definition():
    packed = torch.tensor([[0x10, 0xF8, 0x7A] + [0] * 13], dtype=torch.uint8)  # one block of 32
    scales = torch.tensor([[128]], dtype=torch.uint8)  # 2**1
    w = dequantize_mxfp4(packed, scales, torch.float32)[0, :6].tolist()
    assert w == [0.0, 1.0, -0.0, -12.0, -2.0, 12.0]


def test_quantize_round_trips_grid_values():
    w = torch.tensor([[0.5, -1.5, 3.0, -6.0] * 8]) * 4.0
    packed, scales = quantize_mxfp4(w)
    torch.testing.assert_close(dequantize_mxfp4(packed, scales, torch.float32), w)


def test_quantization_error_is_bounded_by_half_a_step():
    g = torch.Generator().manual_seed(11)
    w = torch.randn(64, 2880, generator=g) * 0.02
    q, s = quantize_mxfp4(w)
    d = dequantize_mxfp4(q, s)
    scale = pow2(s.to(torch.int32) - 127).repeat_interleave(BLOCK, dim=1)
    # e2m1 steps are at most 2 (between 4 and 6) in scaled units; saturation adds at most 1.
    assert ((d - w).abs() / scale <= 1.0 + 1e-6).all()
    rel = (d - w).norm() / w.norm()
    assert 0.05 < rel < 0.15, rel  # ~3 bits of mantissa: an honest sanity range
