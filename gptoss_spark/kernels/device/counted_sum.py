"""Sums across a kernel's programs in one atomic round trip, deterministic: counted fixed-point adds.

n programs each hold an fp32 value for the same output element. Each adds it to a 64-bit word as
`(q << COUNT_BITS) + 1`, q the value in fixed point (FRAC_BITS fractional bits). The word's low
COUNT_BITS count the adds. Integer addition is associative, so the total is the same bits in
whatever order the atomics land. Each add returns the word as it was before it, so the add that
finds n - 1 adds already there is the last one: that word plus its own add is the whole sum. That
program writes the result and zeroes the word for the next launch (and the next CUDA-graph replay).

arrival.py's scheme takes three L2 round trips: the partial store made visible, an acq_rel arrival,
then the last program's read of every partial. This one takes one, in every program, and keeps no
partials buffer.

Range and rounding: a value is truncated to a multiple of 2**-FRAC_BITS (6e-8), so an element's
error is below n * 6e-8 before the result is rounded to fp32. A value that is NaN, infinite or not
below LIMIT (6.7e7) in magnitude adds the marker BAD instead, and an element with a marker in its
sum comes out NaN: an overflow never wraps into a plausible number.
"""

from __future__ import annotations

import triton
import triton.language as tl

_COUNT_BITS = 4
COUNT_BITS = tl.constexpr(_COUNT_BITS)
MAX_ADDS = (1 << _COUNT_BITS) - 1  # adds one word can count
COUNT_MASK = tl.constexpr(MAX_ADDS)
FRAC_BITS = 24
SCALE = tl.constexpr(2.0 ** FRAC_BITS)
UNSCALE = tl.constexpr(2.0 ** -FRAC_BITS)
LIMIT = tl.constexpr(2.0 ** 26)  # |value| below this adds q = value * 2**FRAC_BITS < 2**50
# q of a value that is not below LIMIT. MAX_ADDS valid values sum to less than 15 * 2**50 < 2**54;
# one marker or more puts the sum at or above 2**55 - 14 * 2**50 > 2**54, and MAX_ADDS markers
# (15 * 2**55 < 2**59) still fit the word's 60 bits of q.
BAD = tl.constexpr(2 ** 55)
BAD_FROM = tl.constexpr(2 ** 54)


@triton.jit
def _atomic_add_relaxed(ptr, value, mask, INTERPRET: tl.constexpr):
    """tl.atomic_add(ptr, value, mask, sem="relaxed", scope="gpu"): the values before each add.

    On a GPU as PTX: Triton 3.9 fails to compile down's kernel with tl.atomic_add whose result is
    used (an assertion in TritonGPURemoveLayoutConversions, layout propagation); the same add as
    inline PTX compiles, to the same ATOMG.E.ADD.64.STRONG.GPU. The interpreter runs no PTX.
    """
    if INTERPRET:
        return tl.atomic_add(ptr, value, mask=mask, sem="relaxed", scope="gpu")
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; mov.b64 $0, 0; @p atom.relaxed.gpu.global.add.u64 $0, [$1], $2; }",
            "=l,l,l,r", [ptr, value, mask.to(tl.int32)], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def counted_add(sums_ptr, value, mask, N_ADDS: tl.constexpr, INTERPRET: tl.constexpr):
    """Add fp32 `value` at int64 `sums_ptr` (where `mask`); N_ADDS programs add to each element.

    Returns (last, total): `last` is true where this add was the element's N_ADDS-th, and there
    `total` is the sum of all N_ADDS values as fp32 (NaN if any was NaN, infinite or out of range);
    elsewhere `total` is meaningless. The word is zero again after its last add.
    """
    ok = tl.abs(value) < LIMIT  # false for NaN
    q = tl.where(ok, (tl.where(ok, value, 0.0) * SCALE).to(tl.int64), BAD)  # no NaN into the int cast
    word = (q << COUNT_BITS) + 1
    before = _atomic_add_relaxed(sums_ptr, word, mask, INTERPRET)
    last = mask & ((before & COUNT_MASK) == N_ADDS - 1)
    total_q = (before + word) >> COUNT_BITS  # arithmetic shift: q keeps its sign
    total = tl.where(total_q < BAD_FROM, total_q.to(tl.float32) * UNSCALE, float("nan"))
    # Relaxed and after this thread's own add to the same word: the next launch that adds here
    # starts after this kernel has ended, and the end of a kernel makes its writes visible.
    tl.store(sums_ptr, tl.zeros_like(word), mask=last)
    return last, total
