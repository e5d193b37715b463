"""MXFP4 weight tiles (mxfp4_layout.py) -> bf16 tensor-core A operand, as Triton helpers.

A program's weight tile is C blocks of 64 rows x 64 k, loaded as [C*128, 16]
bytes: one row of 16 bytes per thread and block, (c, w, g, t) = C x warps x
MMA groups x threads-in-group. Every step after the load stays in the thread
that loaded the bytes: decode (a word of 8 weights -> 4 bf16 pairs), then a
join/reshape/permute that only renames registers, so the tile arrives in the
MMA's A-fragment layout without shared memory or shuffles.

DECODE (a constexpr of the expert kernels):
  1  portable: the same bit layout decoded with Triton integer ops and fp32
     multiplies (the CPU interpreter's path; exact, but many instructions).
  2  inline PTX: per word 12 integer ops + 4 mul.rn.bf16x2 by the block's
     factor 2**(s-1). Relies on the bf16 multiply keeping subnormal inputs
     (the device tests check it). GPU only.
"""

from __future__ import annotations

import triton
import triton.language as tl

# bf16 lanes: sign bit 15 and exponent/mantissa bits [8:6], 0x81C081C0 as an int32
SIGN_MAG = tl.constexpr(0x81C081C0 - (1 << 32))
SIGNS = tl.constexpr(0x80008000 - (1 << 32))


@triton.jit
def factors_per_byte(e, R: tl.constexpr, MMA: tl.constexpr):
    """Stored exponents [R, 4] (k32 block a, row r) -> bf16x2 factors 2**(s-1) as int32 [R, 16], one per byte.

    The decode reads the factor of byte 4s + 0 for registers 0 and 2 of word s and
    that of byte 4s + 1 for registers 1 and 3. MMA 3: registers 0/2 are row r=0 and
    1/3 row r=1, word s in k32 block s // 2. MMA 2: word s is one row and one k32
    block (a, r) = (s // 2, s % 2), so all its registers share factor s.
    """
    ei = e.to(tl.int32)
    f = (ei << 7) | (ei << 23)
    if MMA == 3:
        f = tl.broadcast_to(tl.reshape(f, (R, 2, 1, 1, 2)), (R, 2, 2, 2, 2))
    else:
        f = tl.broadcast_to(tl.reshape(f, (R, 4, 1)), (R, 4, 4))
    return tl.reshape(f, (R, 16))


@triton.jit
def decode_ptx(q, factor):
    """q uint8 [R, 16] (4 words), factor int32 [R, 16] (factors_per_byte) -> (h0, h1) bf16 [R, 16].

    h0 holds registers 0, 1 of each word, h1 registers 2, 3; element 4s + 2i + lane
    of h0 is lane `lane` of register i of word s (of h1: register 2 + i).
    """
    # (The PTX is a literal: Triton 3.6 takes no constexpr global as asm text.)
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 a, b, c;
        and.b32 a, $4, 0x81C081C0;
        mul.rn.bf16x2 $0, a, $5;
        shl.b32 a, $4, 3;
        and.b32 a, a, 0x81C081C0;
        mul.rn.bf16x2 $1, a, $6;
        shl.b32 a, $4, 6;
        and.b32 a, a, 0x81C081C0;
        mul.rn.bf16x2 $2, a, $5;
        shl.b32 a, $4, 1;
        and.b32 a, a, 0x80008000;
        shr.b32 b, $4, 3;
        and.b32 b, b, 0x01800180;
        shr.b32 c, $4, 7;
        and.b32 c, c, 0x00400040;
        or.b32 a, a, b;
        or.b32 a, a, c;
        mul.rn.bf16x2 $3, a, $6;
        }
        """,
        "=r,=r,=r,=r,r,r,r,r,r", [q, factor], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def _lanes_f32(reg, factor):
    """int32 bf16x2 pattern [R, 4] -> fp32 [R, 4, 2 (lane)] times factor [R, 4] (exact: no bf16 subnormals)."""
    lo = ((reg & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    hi = (reg & -65536).to(tl.float32, bitcast=True)
    return tl.join(lo * factor, hi * factor)


@triton.jit
def decode_portable(q, factor, R: tl.constexpr):
    """Same contract as decode_ptx, in Triton integer ops and fp32 (runs in the CPU interpreter)."""
    b = tl.reshape(q.to(tl.int32), (R, 4, 4))
    word = tl.sum(b << (tl.arange(0, 4) * 8)[None, None, :], axis=2)  # [R, 4 (s)], disjoint bits
    r0 = word & SIGN_MAG
    r1 = (word << 3) & SIGN_MAG
    r2 = (word << 6) & SIGN_MAG
    r3 = ((word << 1) & SIGNS) | ((word >> 3) & 0x01800180) | ((word >> 7) & 0x00400040)
    # fp32 lane bits = bf16 bits << 16: the e2m1 value * 2**-126. The factor 2**(s-1)
    # as fp32 is the upper bf16 lane of its pattern, shifted into place by the mask.
    f = (factor & 0x7F800000).to(tl.float32, bitcast=True)
    f0, f1 = tl.split(tl.reshape(f, (R, 4, 2, 2)))  # bytes 4s + 2 j_hi + {0, 1}
    f0, _ = tl.split(f0)  # byte 4s + 0: registers 0 and 2
    f1, _ = tl.split(f1)  # byte 4s + 1: registers 1 and 3
    h0 = tl.reshape(tl.permute(tl.join(_lanes_f32(r0, f0), _lanes_f32(r1, f1)), (0, 1, 3, 2)), (R, 16))
    h1 = tl.reshape(tl.permute(tl.join(_lanes_f32(r2, f0), _lanes_f32(r3, f1)), (0, 1, 3, 2)), (R, 16))
    return h0.to(tl.bfloat16), h1.to(tl.bfloat16)


@triton.jit
def to_fragment_order(h0, h1, C: tl.constexpr, MMA: tl.constexpr):
    """(h0, h1) [C*128, 16] -> the logical tile [64 rows, C*64 k]; only renames each thread's registers.

    Rows (c w g t) of the load, elements (s, i, lane) and h0/h1 = h, register j = 2h + i.
    MMA 3: word s = k16 step, j = 2h + r  -> row 16w + 8r + g, k 64c + 16s + 8h + 2t + lane.
    MMA 2: word s = 2a + r, j = k pair    -> row 16w + 8r + g, k 64c + 32a + 8t + 2j + lane.
    """
    x = tl.join(h0, h1)                                         # [(c w g t), (s i lane), h]
    if MMA == 3:
        x = tl.reshape(x, (C, 4, 8, 4, 4, 2, 2, 2))            # c w g t s r lane h
        x = tl.permute(x, (1, 5, 2, 0, 4, 7, 3, 6))            # w r g | c s h t lane
    else:
        x = tl.reshape(x, (C, 4, 8, 4, 2, 2, 2, 2, 2))         # c w g t a r i lane h
        x = tl.permute(x, (1, 5, 2, 0, 4, 3, 8, 6, 7))         # w r g | c a t h i lane
    return tl.reshape(x, (64, C * 64))


@triton.jit
def dot_bf16(a, b, acc, INTERPRET: tl.constexpr):
    if INTERPRET:
        # Triton 3.9's interpreter returns garbage for bf16 x bf16 tl.dot; fp32
        # holds bf16 exactly, so the math is unchanged.
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _decoded_dot(q, e, x_tile, acc, C: tl.constexpr, MMA: tl.constexpr, DECODE: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """acc += decode(q, e) @ x_tile: q [C*128, 16] bytes and e [C*128, 4] exponents as loaded from C blocks."""
    R: tl.constexpr = C * 128
    factor = factors_per_byte(e, R, MMA)
    if DECODE == 2:
        h0, h1 = decode_ptx(q, factor)
    else:
        h0, h1 = decode_portable(q, factor, R)
    return dot_bf16(to_fragment_order(h0, h1, C, MMA), x_tile, acc, INTERPRET)


@triton.jit
def _load_blocks(w_ptr, s_ptr, n_blocks, C: tl.constexpr, MASKED: tl.constexpr, UPPER_W: tl.constexpr,
                 UPPER_S: tl.constexpr):
    """The bytes [C*128, 16] and exponents [C*128, 4] of C consecutive 64x64 blocks, as each thread decodes them.

    MASKED: only the first n_blocks (run time) are read; the others come back as zeros.
    UPPER_W / UPPER_S != 0: the tile's rows 32..63 (warps 2 and 3) are read that many bytes
    further on than the block's own rows 32..63 (mxfp4_split_block_dot).
    """
    rows = tl.arange(0, C * 128)
    w_offs = rows * 16
    s_offs = (rows // 4) * 4
    if UPPER_W != 0:
        upper = (rows % 128) // 64  # load rows (c, w, g, t): w >= 2
        w_offs += upper * UPPER_W
        s_offs += upper * UPPER_S
    w_ptrs = w_ptr + w_offs[:, None] + tl.arange(0, 16)[None, :]
    s_ptrs = s_ptr + s_offs[:, None] + tl.arange(0, 4)[None, :]
    if MASKED:
        ok = (rows // 128 < n_blocks)[:, None]
        return tl.load(w_ptrs, mask=ok, other=0), tl.load(s_ptrs, mask=ok, other=0)
    else:
        return tl.load(w_ptrs), tl.load(s_ptrs)


@triton.jit
def mxfp4_block_dot(w_ptr, s_ptr, x_tile, acc, C: tl.constexpr, MMA: tl.constexpr, DECODE: tl.constexpr,
                    INTERPRET: tl.constexpr):
    """acc [64, M_PAD] += W[64 rows, C*64 k] @ x_tile [C*64, M_PAD].

    w_ptr / s_ptr point at the first of C consecutive 64x64 blocks of one row block,
    stored in layout MMA (mxfp4_layout.py).
    """
    q, e = _load_blocks(w_ptr, s_ptr, C, C, False, 0, 0)
    return _decoded_dot(q, e, x_tile, acc, C, MMA, DECODE, INTERPRET)


@triton.jit
def mxfp4_split_block_dot(w_ptr, s_ptr, x_tile, acc, UPPER_W: tl.constexpr, UPPER_S: tl.constexpr, C: tl.constexpr,
                          MMA: tl.constexpr, DECODE: tl.constexpr, INTERPRET: tl.constexpr):
    """mxfp4_block_dot of a tile put together from two half blocks: acc [64, M_PAD] += T @ x_tile.

    T's rows 0..31 are rows 0..31 of the C blocks at w_ptr / s_ptr (warps 0 and 1 of the
    layout: the first 1024 bytes and 64 scale bytes of a block); T's rows 32..63 are the 32
    rows found UPPER_W / UPPER_S bytes after what would be the blocks' rows 32..63. Only
    the addresses differ from mxfp4_block_dot: each thread decodes the same positions.
    """
    q, e = _load_blocks(w_ptr, s_ptr, C, C, False, UPPER_W, UPPER_S)
    return _decoded_dot(q, e, x_tile, acc, C, MMA, DECODE, INTERPRET)


@triton.jit
def mxfp4_block_dot_first(w_ptr, s_ptr, x_tile, n_blocks, acc, C: tl.constexpr, MMA: tl.constexpr,
                          DECODE: tl.constexpr, INTERPRET: tl.constexpr):
    """mxfp4_block_dot over only the first n_blocks (run time, 0..C) of the C blocks: the rest count as zero
    weights and are not read (x_tile must be finite there)."""
    q, e = _load_blocks(w_ptr, s_ptr, n_blocks, C, True, 0, 0)
    return _decoded_dot(q, e, x_tile, acc, C, MMA, DECODE, INTERPRET)


@triton.jit
def load_activations(ptrs, col_ok, MASK_COLS: tl.constexpr):
    """The activation tile at ptrs [k, token columns].

    With MASK_COLS only the columns col_ok [columns] are read; the others are zeros
    and cost no memory request. Padding columns point at a real row, so without the
    mask every program of the grid asks for those L2 lines once per padding column:
    a hot spot. Measured on the H200: decode at 1 to 8 tokens, 16
    columns (layout 3) 3 to 15 us per layer faster; prefill 1.3x to 1.9x (distinct
    rows instead of one). At 32 columns the mask costs gate_up 50 to 60 registers
    (sm_90a and sm_121a: 197 -> 254, spilling), so the decode kernels mask only
    tiles of up to 16 columns.
    """
    if MASK_COLS:
        return tl.load(ptrs, mask=col_ok[None, :], other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def mxfp4_rows_dot(w_ptr, s_ptr, blk, act_rows, act_ok, k_lo, k_hi, N_LOOP: tl.constexpr, MASKED: tl.constexpr,
                   acc, C: tl.constexpr, MMA: tl.constexpr, DECODE: tl.constexpr, INTERPRET: tl.constexpr,
                   MASK_COLS: tl.constexpr):
    """acc [64, M_PAD] += W[one row block, 64-k blocks k_lo..k_hi) @ act[those k, M_PAD token columns].

    blk is the index of the row block's first 64x64 block (the blocks of a row
    block are consecutive); act_rows [M_PAD] points at each token column's
    activation row; with MASK_COLS only the columns act_ok [M_PAD] are read
    (load_activations). The loop takes C blocks per iteration over N_LOOP blocks (a
    constexpr multiple of C): with a run-time trip count the pipelined loop took
    246 registers instead of 164 (down at one token, Triton 3.6).

    MASKED = False: k_lo, k_hi are constant (the whole of K), N_LOOP <= k_hi - k_lo,
    and the blocks after the loop go one at a time in a second loop (not unrolled:
    unrolling 3 of them took 40 more registers).
    MASKED = True: k_lo, k_hi may be run-time values (a share of K) and
    N_LOOP >= k_hi - k_lo; blocks at or past k_hi are masked (not read, zero
    weights). Not a second loop: a loop with a run-time trip count around a
    wgmma has ptxas serialize every wgmma of the kernel (C7513), and a
    straight-line tail after the loop took 26 to 48 more registers.
    """
    offs_k = tl.arange(0, C * 64)
    w_ptr += (blk + k_lo) * 2048
    s_ptr += (blk + k_lo) * 128
    act_rows += k_lo * 64
    for c0 in range(0, N_LOOP, C):
        if MASKED:
            n_here = k_hi - k_lo - c0
            mask = (offs_k // 64 < n_here)[:, None]
            if MASK_COLS:
                mask = mask & act_ok[None, :]
            at = tl.load(act_rows[None, :] + (c0 * 64 + offs_k)[:, None], mask=mask, other=0.0)
            acc = mxfp4_block_dot_first(w_ptr + c0 * 2048, s_ptr + c0 * 128, at, n_here, acc, C, MMA, DECODE,
                                        INTERPRET)
        else:
            at = load_activations(act_rows[None, :] + (c0 * 64 + offs_k)[:, None], act_ok, MASK_COLS)
            acc = mxfp4_block_dot(w_ptr + c0 * 2048, s_ptr + c0 * 128, at, acc, C, MMA, DECODE, INTERPRET)
    if not MASKED:
        for c0 in range(N_LOOP, k_hi - k_lo):
            at = load_activations(act_rows[None, :] + (c0 * 64 + tl.arange(0, 64))[:, None], act_ok, MASK_COLS)
            acc = mxfp4_block_dot(w_ptr + c0 * 2048, s_ptr + c0 * 128, at, acc, 1, MMA, DECODE, INTERPRET)
    return acc
