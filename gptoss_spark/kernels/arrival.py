"""Last-to-arrive among a kernel's programs (the threadfence-reduction pattern), as Triton helpers.

Programs that each wrote a partial result call last_to_arrive on a shared
counter; exactly one of them, the last, gets True and may read every other
program's stores. Every thread first fences its own writes at GPU scope, then
the barrier, then one thread's acq_rel atomic on the counter; the last program
acquires them all. (The fence in every thread is not decoration: with only the
counter's own release, run by one thread, the last program of the fused down
read sums that other warps' atomic adds had not yet delivered: wrong outputs at
4 and 8 tokens on the H200, benchmarks/kernels/results/run15.) It then calls
reset_arrivals so the counter is zero for the next launch, and for the next
replay of a CUDA graph that captured it (the counters live in moe._counters).

publish_flag / wait_flag hand one program's results to one other program that
waits for them; each waiter clears its flag.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fence_writes(INTERPRET: tl.constexpr = False):
    """This thread's earlier writes (atomics included) ordered before its later ones, at GPU scope."""
    if not INTERPRET:  # (the interpreter runs programs one at a time, and has no inline asm)
        tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def arrive(counter_ptr, units, INTERPRET: tl.constexpr = False):
    """Add units to the counter once all this program's writes are published; -> the count before them."""
    fence_writes(INTERPRET)
    tl.debug_barrier()
    return tl.atomic_add(counter_ptr, units, sem="acq_rel", scope="gpu")


@triton.jit
def last_to_arrive(counter_ptr, n_arrivals, INTERPRET: tl.constexpr = False):
    return arrive(counter_ptr, 1, INTERPRET) == n_arrivals - 1


@triton.jit
def reset_arrivals(counter_ptr):
    tl.atomic_xchg(counter_ptr, 0)


@triton.jit
def publish_flag(flag_ptr, INTERPRET: tl.constexpr = False):
    """Set the flag once all this program's writes are published (wait_flag's other half)."""
    fence_writes(INTERPRET)
    tl.debug_barrier()
    tl.atomic_xchg(flag_ptr, 1, sem="release", scope="gpu")


@triton.jit
def wait_flag(flag_ptr):
    """Spin until publish_flag sets the flag, acquire what its program wrote, and clear the flag for the next use.

    Only for a program known to be running (moe_down_fused.py): a program waiting on one
    that has not started could hold the slot it needs.
    """
    while tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu") == 0:
        pass
    tl.atomic_xchg(flag_ptr, 0)
    tl.debug_barrier()
