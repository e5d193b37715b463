"""Fused decode MoE, final step when the down stage is split: out[m, n] = bf16(sum_p partial[p, m, n]).

Adds the SPLIT fp32 partials of moe_down_kernel in a fixed order (deterministic).
A few KB per layer: the cost is the launch.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M"])
def moe_combine_kernel(partial_ptr, out_ptr, M, H, stride_om, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < M * H
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in tl.static_range(SPLIT):
        acc += tl.load(partial_ptr + p * M * H + offs, mask=ok, other=0.0)
    m = offs // H
    n = offs % H
    tl.store(out_ptr + m * stride_om + n, acc.to(tl.bfloat16), mask=ok)
