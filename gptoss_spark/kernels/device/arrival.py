"""Last-to-arrive among a kernel's programs (the threadfence-reduction pattern), as Triton helpers.

Programs that each wrote a partial result call last_to_arrive on a shared
counter; exactly one of them, the last, gets True and may read every other
program's stores. The barrier orders each thread's stores before the counter's
release (acq_rel, GPU scope); the last program acquires them. It then calls
reset_arrivals so the counter is zero for the next launch, and for the next
replay of a CUDA graph that captured it (the counters live in moe._counters).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def last_to_arrive(counter_ptr, n_arrivals):
    tl.debug_barrier()
    return tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == n_arrivals - 1


@triton.jit
def reset_arrivals(counter_ptr):
    # Relaxed: the next launch that counts here starts after this kernel has ended, and the end of
    # a kernel makes its writes visible. (The default, acq_rel, put a GPU-wide fence before the
    # exchange, where the last program waits for its own result stores to land: relaxed is
    # -0.5 us per layer at one token on layout 3, -0.2 us on layout 2, H200.)
    tl.atomic_xchg(counter_ptr, 0, sem="relaxed")
