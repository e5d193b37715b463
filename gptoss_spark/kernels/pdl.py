"""Programmatic dependent launch (PDL, sm_90+): overlap a kernel's launch with the previous kernel's tail.

A kernel launched with launch_pdl=True may start while the kernel before it on
the stream still runs; griddepcontrol.wait then blocks until that kernel has
finished and its writes are visible. Each of the three MoE kernels calls
pdl_prologue first: it lets the next kernel launch at once (its programs then
wait in their own prologue) and waits for the previous kernel's results.
Without PDL both instructions return at once. (MoeLaunchConfig.pdl)
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
