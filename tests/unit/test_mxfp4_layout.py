"""The kernels' MXFP4 layout (mxfp4_layout.py): exact round trips, where each weight lands, bad input."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gptoss_spark.kernels import mxfp4_layout as L  # noqa: E402


def random_blocks(e, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("mma", [2, 3])
def test_values_round_trip(mma):
    b = random_blocks(5, 128, 192)  # 5 experts: more than one repack step of 4
    sw = L.swizzle_values(b, mma)
    assert sw.shape == (5, 2, 3, L.BLOCK_BYTES)
    assert torch.equal(L.unswizzle_values(sw, 128, 192, mma), b)


def test_scales_round_trip_and_bias():
    g = torch.Generator().manual_seed(1)
    s = torch.randint(0, 129, (3, 64, 4), dtype=torch.uint8, generator=g)
    sw = L.swizzle_scales(s)
    assert sw.shape == (3, 1, 2, L.SCALE_BLOCK_BYTES)
    assert int(sw.min()) >= L.SCALE_BIAS  # stored as the bf16 exponent of 2**(s-1)
    assert torch.equal(L.unswizzle_scales(sw, 64, 128), s)


@pytest.mark.parametrize("mma,word,reg,lane,row,k", [
    # thread (w=1, g=2, t=3): layout 3, word s=1 holds k16 step 1; register 3 = (h=1, r=1)
    (3, 1, 3, 1, 16 + 8 + 2, 16 + 8 + 2 * 3 + 1),
    # layout 2, word s=3 = (a=1, r=1); register j=2 is the third k pair of the thread's 8
    (2, 3, 2, 1, 16 + 8 + 2, 32 + 8 * 3 + 2 * 2 + 1),
])
def test_a_weight_lands_in_its_mma_fragment(mma, word, reg, lane, row, k):
    """The code of weight (row, k) is where the thread that owns it in the MMA fragment decodes it."""
    b = random_blocks(1, 64, 64, seed=mma)
    codes = L._unpack_words(L.swizzle_values(b, mma).reshape(4, 8, 4, 4, 4))  # w g t s byte -> j lane
    want = (b[0, row, k // 2] >> (4 * (k % 2))) & 0xF
    assert int(codes[1, 2, 3, word, reg, lane]) == int(want)


def register_bits(q: int, j: int) -> int:
    """What the decode (mxfp4_decode.py) computes for register j of word q."""
    if j < 3:
        return (q << (3 * j)) & 0x81C081C0
    return ((q << 1) & 0x80008000) | ((q >> 3) & 0x01800180) | ((q >> 7) & 0x00400040)


def test_word_bits_decode_to_bf16_times_2_pow_minus_126():
    """The bit layout's promise: each register is a bf16 pair equal to its two e2m1 codes * 2**-126."""
    import struct
    from gptoss_spark.mxfp4 import dequantize_mxfp4
    values = [float(v) for v in dequantize_mxfp4(torch.tensor([[0x10 * c + c for c in range(16)]], dtype=torch.uint8),
                                                 torch.tensor([[127]], dtype=torch.uint8), torch.float32)[0, 0::2]]
    for code in range(16):
        c = torch.full((1, 4, 2), code, dtype=torch.int32)
        word = int.from_bytes(bytes(L._pack_words(c)[0].tolist()), "little")
        for j in range(4):
            reg = register_bits(word, j)
            for lane in range(2):
                bits = (reg >> (16 * lane)) & 0xFFFF
                as_float = struct.unpack("<f", struct.pack("<I", bits << 16))[0]
                assert as_float * 2.0 ** 126 == values[code], (code, j, lane)


def test_scale_too_large_is_refused_in_one_line():
    s = torch.full((1, 64, 2), 129, dtype=torch.uint8)  # 2**2 > 2
    with pytest.raises(L.LayoutError, match="unset GPTOSS_SPARK_MOE"):
        L.swizzle_scales(s)


def test_shapes_not_multiple_of_64_are_refused():
    with pytest.raises(L.LayoutError, match="multiples of 64"):
        L.swizzle_values(torch.zeros((1, 96, 32), dtype=torch.uint8))


def test_gate_up_rows_first():
    t = torch.arange(12).reshape(1, 6, 2)
    assert L.gate_up_rows_first(t)[0, :, 0].tolist() == [0, 4, 8, 2, 6, 10]
