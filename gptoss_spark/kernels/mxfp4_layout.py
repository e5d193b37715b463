"""The kernels' MXFP4 weight layout: a one-time repack of the checkpoint's experts at load.

Why a repack: the expert kernels feed the weights to the tensor cores as the
A operand straight from registers (no shared-memory round trip, no shuffles).
That works only if each thread's 16-byte load already holds exactly the
values its MMA fragments need, and if 8 weights decode from one 32-bit word
in a few instructions. Both are properties of how the bytes sit in memory,
so the layout is chosen for the decode, once, at load time.

A block is 64 rows x 64 k; four warps take 16 rows each (warp w: rows
16w..16w+15) and thread (w, g, t), lane = 4g + t, loads 16 bytes = 4 words of
8 weights, for rows 16w + g + 8r (r = 0, 1). Which k a thread holds depends on
the MMA Triton uses for the A operand in registers (the `mma` layout version):
  3  Hopper wgmma (kWidth 2): word s = k16 step, register j = 2h + r holds
     row r, k = 16s + 8h + 2t + {0, 1}
  2  mma.sync (Ampere-style, sm_80..sm_121 incl. GB10; kWidth 8): word s = 2a + r
     is row r, k = 32a + 8t + 2j + {0, 1} (8 consecutive k of one row)
Each register is a bf16 pair (k even, k odd). The layout version is chosen at
repack from the GPU (mma_layout_for) and passed to the kernels as MMA.

Storage, per expert and matrix [N rows, K]:
  values [N/64, K/64, 4 (w), 8 (g), 4 (t), 4 (s), 4 bytes]   2048 bytes per 64x64 block
  scales [N/64, K/64, 4 (w), 8 (g), 2 (k32 block), 2 (r)]     128 bytes per block (both versions),
stored as e = s + 126 (the exponent of the bf16 factor 2**(s-1), see below).

Bits of a word (8 codes: register j, lane e = k parity). Each code's sign goes
to bf16 bit 15 and its 3 exponent/mantissa bits to bf16 bits [8:6], which makes
a bf16 equal to the e2m1 value times 2**-126 (e=0 lands on subnormals, exact);
multiplying by the factor 2**(s-1) gives the dequantized weight exactly.
  j = 0, 1, 2: the code sits 3*j bits below its target: R_j = (q << 3j) & 0x81C081C0
  j = 3: sign at bit 14, exponent at [11:10], mantissa at 13 (the bits left over)
(lane 1 is the same 16 bits higher). Decoding a word is 12 integer ops + 4 bf16x2
multiplies for 8 weights.
"""

from __future__ import annotations

import torch

BLOCK_ROWS = 64
BLOCK_K = 64
BLOCK_BYTES = BLOCK_ROWS * BLOCK_K // 2    # 2048
SCALE_BLOCK_BYTES = BLOCK_ROWS * BLOCK_K // 32  # 128
SCALE_BIAS = 126  # stored e = s + 126 = exponent field of bf16 2**(s-1)
MAX_SCALE = 128   # e8m0 2**(s-127) <= 2: the factor 2**(s-1) must be a finite bf16


class LayoutError(ValueError):
    pass


def _codes(blocks: torch.Tensor) -> torch.Tensor:
    """[..., N, K/2] packed (low nibble = even k) -> [..., N, K] codes 0..15."""
    b = blocks.to(torch.int32)
    return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)


def _pack_words(c: torch.Tensor) -> torch.Tensor:
    """codes [..., 4 (j), 2 (e)] int32 -> [..., 4] uint8, the little-endian bytes of each word."""
    word = torch.zeros(c.shape[:-2], dtype=torch.int64, device=c.device)
    for j in range(4):
        for e in range(2):
            code = c[..., j, e].to(torch.int64)
            sign, mag = code >> 3, code & 7
            lane = 16 * e
            if j < 3:
                word |= (sign << (15 + lane - 3 * j)) | (mag << (6 + lane - 3 * j))
            else:
                word |= (sign << (14 + lane)) | ((mag >> 1) << (10 + lane)) | ((mag & 1) << (13 + lane))
    return torch.stack([(word >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)


def _unpack_words(b: torch.Tensor) -> torch.Tensor:
    """Inverse of _pack_words: [..., 4] uint8 -> codes [..., 4 (j), 2 (e)] int32."""
    word = sum(b[..., i].to(torch.int64) << (8 * i) for i in range(4))
    codes = []
    for j in range(4):
        lanes = []
        for e in range(2):
            lane = 16 * e
            if j < 3:
                sign = (word >> (15 + lane - 3 * j)) & 1
                mag = (word >> (6 + lane - 3 * j)) & 7
            else:
                sign = (word >> (14 + lane)) & 1
                mag = (((word >> (10 + lane)) & 3) << 1) | ((word >> (13 + lane)) & 1)
            lanes.append((sign << 3) | mag)
        codes.append(torch.stack(lanes, dim=-1))
    return torch.stack(codes, dim=-2).to(torch.int32)


def mma_layout_for(device) -> int:
    """The layout version for a device (the CPU interpreter takes either; 3 is the default)."""
    if torch.device(device).type != "cuda":
        return 3
    return mma_layout_for_capability(torch.cuda.get_device_capability(device)[0])


def mma_layout_for_capability(major: int) -> int:
    """3 on Hopper (wgmma), 2 elsewhere; 2 also when Triton's wgmma is disabled (DISABLE_MMA_V3=1)."""
    import os
    return 3 if major == 9 and os.environ.get("DISABLE_MMA_V3", "0") in ("", "0") else 2


def check_shape(n: int, k: int) -> None:
    if n % BLOCK_ROWS or k % BLOCK_K:
        raise LayoutError(f"expert matrix {n}x{k}: rows and columns must be multiples of 64 for the kernels' layout")


def swizzle_values(blocks: torch.Tensor, mma: int = 3, experts_per_step: int = 4) -> torch.Tensor:
    """Checkpoint blocks [E, N, K/2] uint8 -> [E, N/64, K/64, 2048] uint8 (see module doc).

    A few experts at a time: the integer temporaries are ~40x the packed bytes,
    which for a whole gpt-oss-120b layer would be tens of GB at load.
    """
    e, n, k2 = blocks.shape
    check_shape(n, 2 * k2)
    if mma not in (2, 3):
        raise LayoutError(f"mma layout {mma}: expected 2 or 3")
    out = torch.empty((e, n // 64, k2 // 32, BLOCK_BYTES), dtype=torch.uint8, device=blocks.device)
    for first in range(0, e, experts_per_step):
        out[first:first + experts_per_step] = _swizzle_some(blocks[first:first + experts_per_step], mma)
    return out


def _swizzle_some(blocks: torch.Tensor, mma: int) -> torch.Tensor:
    e, n, k2 = blocks.shape
    k = 2 * k2
    c = _codes(blocks)  # [E, N, K]
    if mma == 3:  # row = 64 rb + 16 w + 8 r + g ; k = 64 cb + 16 s + 8 h + 2 t + lane
        c = c.reshape(e, n // 64, 4, 2, 8, k // 64, 4, 2, 4, 2)  # E rb w r g cb s h t lane
        c = c.permute(0, 1, 5, 2, 4, 8, 6, 7, 3, 9)             # E rb cb w g t s | j = (h r) | lane
    else:  # row = 64 rb + 16 w + 8 r + g ; k = 64 cb + 32 a + 8 t + 2 j + lane
        c = c.reshape(e, n // 64, 4, 2, 8, k // 64, 2, 4, 4, 2)  # E rb w r g cb a t j lane
        c = c.permute(0, 1, 5, 2, 4, 7, 6, 3, 8, 9)             # E rb cb w g t | s = (a r) | j | lane
    c = c.reshape(e, n // 64, k // 64, 4, 8, 4, 4, 4, 2)
    return _pack_words(c).reshape(e, n // 64, k // 64, BLOCK_BYTES)


def unswizzle_values(sw: torch.Tensor, n: int, k: int, mma: int = 3) -> torch.Tensor:
    """Inverse of swizzle_values -> [E, N, K/2] uint8 (tests)."""
    e = sw.shape[0]
    c = _unpack_words(sw.reshape(e, n // 64, k // 64, 4, 8, 4, 4, 4))  # E rb cb w g t s j lane
    if mma == 3:
        c = c.reshape(e, n // 64, k // 64, 4, 8, 4, 4, 2, 2, 2)  # E rb cb w g t s h r lane
        c = c.permute(0, 1, 3, 8, 4, 2, 6, 7, 5, 9)
    else:
        c = c.reshape(e, n // 64, k // 64, 4, 8, 4, 2, 2, 4, 2)  # E rb cb w g t a r j lane
        c = c.permute(0, 1, 3, 7, 4, 2, 6, 5, 8, 9)
    c = c.reshape(e, n, k)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """Checkpoint e8m0 scales [E, N, K/32] -> [E, N/64, K/64, 128] uint8 holding s + 126."""
    e, n, k32 = scales.shape
    check_shape(n, 32 * k32)
    top = int(scales.max()) if scales.numel() else 0
    if top > MAX_SCALE:
        raise LayoutError(f"MXFP4 scale 2**{top - 127} > 2 in an expert: the kernels' bf16 factor 2**(s-1) "
                          f"would overflow; use vLLM's MoE backend for this checkpoint (unset GPTOSS_SPARK_MOE)")
    s = scales.to(torch.int32) + SCALE_BIAS
    # row = 64 rb + 16 w + 8 r + g ; k32 block = 2 cb + kb
    s = s.reshape(e, n // 64, 4, 2, 8, k32 // 2, 2)
    s = s.permute(0, 1, 5, 2, 4, 6, 3)  # E rb cb w g kb r
    return s.reshape(e, n // 64, k32 // 2, SCALE_BLOCK_BYTES).to(torch.uint8).contiguous()


def unswizzle_scales(sw: torch.Tensor, n: int, k: int) -> torch.Tensor:
    e = sw.shape[0]
    s = sw.reshape(e, n // 64, k // 64, 4, 8, 2, 2).to(torch.int32) - SCALE_BIAS
    return s.permute(0, 1, 3, 6, 4, 2, 5).reshape(e, n, k // 32).to(torch.uint8)


def gate_up_rows_first(t: torch.Tensor) -> torch.Tensor:
    """w13 rows (and biases) interleaved gate/up (2j gate, 2j+1 up) -> all gate rows, then all up rows.

    The gate_up kernel then reads gate features [64b, 64b+64) as row block b and
    the matching up features as row block I/64 + b.
    """
    return torch.cat((t[:, 0::2], t[:, 1::2]), dim=1)


class SwizzledExperts:
    """The experts of one MoE layer in the kernels' layout, repacked for layout version `mma`.

    What the launchers take (moe.fused_moe_decode, moe.DecodeLaunches, ops.moe_block_any,
    device/moe_prefill.py): w13 [E, 2I/64, H/64, 2048] u8 (gate rows first, then up rows), s13
    [E, 2I/64, H/64, 128] u8, b13 [E, 2I] or None; w2 [E, H/64, I/64, 2048], s2 [E, H/64, I/64, 128],
    b2 [E, H] or None. The custom ops take the six tensors (tensors()), as torch.library needs, and
    wrap them in this again.
    """

    def __init__(self, w13, s13, b13, w2, s2, b2, mma: int):
        self.w13, self.s13, self.b13 = w13, s13, b13
        self.w2, self.s2, self.b2 = w2, s2, b2
        self.mma = mma

    @property
    def hidden(self) -> int:
        return self.w13.shape[2] * BLOCK_K

    @property
    def intermediate(self) -> int:
        return self.w13.shape[1] * BLOCK_ROWS // 2

    @classmethod
    def from_checkpoint(cls, w13, s13, b13, w2, s2, b2, mma: int | None = None) -> "SwizzledExperts":
        """Checkpoint tensors (blocks [E, N, K/32, 16] or [E, N, K/2]; scales [E, N, K/32]; biases [E, N])."""
        w13 = w13.flatten(-2) if w13.dim() == 4 else w13
        w2 = w2.flatten(-2) if w2.dim() == 4 else w2
        hidden, intermediate = w13.shape[2] * 2, w2.shape[2] * 2
        if w13.shape[1] != 2 * intermediate or w2.shape[1] != hidden:
            raise LayoutError(f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} are not a gpt-oss expert pair")
        mma = mma_layout_for(w13.device) if mma is None else mma
        return cls(swizzle_values(gate_up_rows_first(w13), mma), swizzle_scales(gate_up_rows_first(s13)),
                   None if b13 is None else gate_up_rows_first(b13).contiguous(),
                   swizzle_values(w2, mma), swizzle_scales(s2), None if b2 is None else b2.contiguous(), mma)

    def tensors(self) -> tuple:
        """(w13, s13, b13, w2, s2, b2): the experts' arguments of the custom ops (ops.py), in order."""
        return self.w13, self.s13, self.b13, self.w2, self.s2, self.b2
