"""Programmatic dependent launch (PDL, sm_90+): start the next kernel's programs during this one's tail.

A kernel launched with launch_pdl=True may start while the kernel before it on
the stream still runs. Its programs call pdl_wait before their first read of
that kernel's results: griddepcontrol.wait returns once the previous kernel has
finished and its writes are visible. A kernel calls pdl_launch_next when its
programs are past their main loop: the next kernel's programs are then placed
while the epilogues (the last-to-arrive sums, the router's top-k) run, instead
of after them. (Both at every kernel's start instead cost +6 us at one token
on the H200, likely because early-placed programs that wait hold SM slots;
MoeLaunchConfig.pdl.) Without PDL both return at once; with PDL off they are
not even emitted.

A kernel may read before its pdl_wait what the previous kernel's programs
released before they launched it (pdl_release_then_launch_next), and what a
kernel two launches back wrote: the previous kernel's programs launch it only
after their own pdl_wait, so that kernel had ended and its writes were visible.
down reads the routing so, whether gate_up (1-2 tokens) or the router wrote it
(moe_down.py).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def pdl_launch(pdl: bool) -> dict:
    """Launch keywords for a kernel with a PDL constexpr: none at all when off."""
    return {"PDL": True, "launch_pdl": True} if pdl else {}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    if PDL:
        gdc_wait()


@triton.jit
def pdl_launch_next(PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_release_then_launch_next(PDL: tl.constexpr, release):
    """pdl_launch_next, after a GPU-scope fence in the programs where `release` is true.

    Each thread's fence makes its earlier stores visible GPU-wide before it goes on, so the next
    kernel's programs, placed only once every program has launched them, may read those stores
    before their pdl_wait (fence.acq_rel.gpu: one L2 round trip, only where asked for).
    """
    if PDL:
        if release:
            tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r,r", [release.to(tl.int32)],
                                      dtype=tl.int32, is_pure=False, pack=1)
        gdc_launch_dependents()
