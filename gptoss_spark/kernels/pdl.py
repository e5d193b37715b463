"""Programmatic dependent launch (PDL, sm_90+): start the next kernel's programs during this one's tail.

A kernel launched with launch_pdl=True may start while the kernel before it on
the stream still runs. Its programs call pdl_wait before their first read of
that kernel's results: griddepcontrol.wait returns once the previous kernel has
finished and its writes are visible. A kernel calls pdl_launch_next when its
programs are past their main loop: the next kernel's programs are then placed
while the epilogues (the last-to-arrive sums, the router's top-k) run, instead
of after them. (Session 2 tried both at every kernel's start: +6 us at one
token, results/run9; MoeLaunchConfig.pdl.) Without PDL both return at once;
with PDL off they are not even emitted.
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
