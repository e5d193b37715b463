"""MXFP4 tile decode + dot as Triton helpers (inlined into the expert kernels), in three variants.

DECODE (a constexpr of the expert kernels):
  0  tl.dot_scaled: Triton upcasts e2m1 to bf16 itself (native block-scaled MMA
     where a target has it and both sides are MX; here the activations are bf16).
  1  portable bit trick in Triton ops: put the code's 3 exponent/mantissa bits
     under a float's exponent/mantissa boundary and its sign on the sign bit; that
     float is the e2m1 value times a fixed power of two (e=0 lands on subnormals,
     which is what makes the trick exact), so one multiply by a power of two built
     from the e8m0 scale gives the dequantized weight exactly. fp16 bits, fp32 math.
  2  the same trick on packed 32-bit registers in inline PTX, with bf16 bits: one
     shift/and/or sequence makes two bf16 (value * 2**-126) and mul.rn.bf16x2 by
     2**(scale-1) finishes both, about 3 instructions per weight. Relies on bf16
     multiply keeping subnormal inputs (the device tests check it). GPU only.
Variants 1 and 2 return even-k and odd-k halves (low and high nibbles) so the
dot runs as two tensor-core dots against x's even and odd k: no interleave.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scale_factor_bf16(s):
    """e8m0 uint8 -> bf16 2**(s-1) (= 2**126 * 2**(s-127)); saturates at 2**127 for s > 128."""
    e = tl.minimum(s.to(tl.int32) + 126, 254)
    # int32 math then int16: Triton 3.6 promotes int16 + constant to int32.
    return (e << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def expand_scales(f, BN: tl.constexpr, BK: tl.constexpr):
    """[BN, BK/32] per-block factors -> [BN, BK/2], one per packed byte."""
    return tl.reshape(tl.broadcast_to(f[:, :, None], (BN, BK // 32, 16)), (BN, BK // 2))


@triton.jit
def scale_factor_f32(s):
    """e8m0 uint8 -> fp32 2**(s-113) (= 2**14 * 2**(s-127)), the factor for the fp16 trick below."""
    return ((s.to(tl.int32) + 14) << 23).to(tl.float32, bitcast=True)


@triton.jit
def decode_e2m1_portable(w, f):
    """uint8 [BN, BK/2] + fp32 factors [BN, BK/2] -> (even-k, odd-k) bf16 [BN, BK/2].

    Same trick on fp16 bits (3 bits at [11:9], sign at 15: value * 2**-14), since
    the fp16 -> fp32 conversion keeps fp16 subnormals exact everywhere (the CPU
    interpreter flushes bf16 subnormals).
    """
    w = w.to(tl.int32)
    lo = (((w & 7) << 9) | ((w & 8) << 12)).to(tl.int16)
    hi = ((((w >> 4) & 7) << 9) | (((w >> 4) & 8) << 12)).to(tl.int16)
    lo = (lo.to(tl.float16, bitcast=True).to(tl.float32) * f).to(tl.bfloat16)
    hi = (hi.to(tl.float16, bitcast=True).to(tl.float32) * f).to(tl.bfloat16)
    return lo, hi


@triton.jit
def decode_e2m1_ptx(w, f):
    # Four packed bytes b0..b3 in $4, their factors as bf16x2 in $5 (b0, b1) and $6 (b2, b3).
    # prmt spreads two bytes to bit 0 and bit 16 so both 16-bit lanes use the same shifts.
    # (The PTX is a literal here: Triton 3.6 takes no constexpr global as asm text.)
    lo, hi = tl.inline_asm_elementwise(
        """
        {
        .reg .b32 t, a, b;
        prmt.b32 t, $4, 0, 0x4140;
        shl.b32 a, t, 6;  and.b32 a, a, 0x01C001C0;
        shl.b32 b, t, 12; and.b32 b, b, 0x80008000;
        or.b32 a, a, b;   mul.rn.bf16x2 $0, a, $5;
        shl.b32 a, t, 2;  and.b32 a, a, 0x01C001C0;
        shl.b32 b, t, 8;  and.b32 b, b, 0x80008000;
        or.b32 a, a, b;   mul.rn.bf16x2 $2, a, $5;
        prmt.b32 t, $4, 0, 0x4342;
        shl.b32 a, t, 6;  and.b32 a, a, 0x01C001C0;
        shl.b32 b, t, 12; and.b32 b, b, 0x80008000;
        or.b32 a, a, b;   mul.rn.bf16x2 $1, a, $6;
        shl.b32 a, t, 2;  and.b32 a, a, 0x01C001C0;
        shl.b32 b, t, 8;  and.b32 b, b, 0x80008000;
        or.b32 a, a, b;   mul.rn.bf16x2 $3, a, $6;
        }
        """,
        "=r,=r,=r,=r,r,r,r", [w, f], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    return lo, hi


@triton.jit
def dot_bf16(a, b, acc, INTERPRET: tl.constexpr):
    if INTERPRET:
        # Triton 3.9's interpreter returns garbage for bf16 x bf16 tl.dot; fp32
        # holds bf16 exactly, so the math is unchanged.
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def mxfp4_dot(w, s, x_rows, x_row_ok, k_left, acc,
              BN: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr, INTERPRET: tl.constexpr):
    """acc [BN, M_PAD] += W_tile [BN, BK] @ X_tile^T.

    w uint8 [BN, BK/2] packed along K, s uint8 [BN, BK/32] e8m0; x_rows [M_PAD]
    pointers to each token's bf16 activations at this tile's first k, x_row_ok
    which tokens to read, k_left how many k remain (the last tile is partial).
    """
    if DECODE == 0:
        k = tl.arange(0, BK)
        xt = tl.load(x_rows[None, :] + k[:, None], mask=x_row_ok[None, :] & (k < k_left)[:, None], other=0.0)
        return tl.dot_scaled(w, s, "e2m1", xt, None, "bf16", acc)
    else:
        if DECODE == 1:
            lo, hi = decode_e2m1_portable(w, expand_scales(scale_factor_f32(s), BN, BK))
        else:
            lo, hi = decode_e2m1_ptx(w, expand_scales(scale_factor_bf16(s), BN, BK))
        k_even = 2 * tl.arange(0, BK // 2)
        mask = x_row_ok[None, :] & (k_even < k_left)[:, None]
        acc = dot_bf16(lo, tl.load(x_rows[None, :] + k_even[:, None], mask=mask, other=0.0), acc, INTERPRET)
        return dot_bf16(hi, tl.load(x_rows[None, :] + k_even[:, None] + 1, mask=mask, other=0.0), acc, INTERPRET)
