"""What a kernel boundary costs on this GPU: the floor under a layer of three dependent launches.

Run on a CUDA GPU from the repo root:
    python benchmarks/kernels/bench_launch_gap.py

One "step" kernel: 360 programs of 4 warps (the expert kernels' grid at one
token) that each wait for the previous kernel (PDL), read 512 bytes the previous
step wrote, spin `work` dependent FMAs, and write 512 bytes. Timed as CUDA-graph
replays of n steps (each depending on the one before), per step, beside one launch
doing the same n x work: the difference is what each boundary costs (grid drain,
memory flush, the next grid's ramp), with and without programmatic dependent launch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernels.bench_moe import graph_ms  # noqa: E402
from gptoss_spark.kernels.device.pdl import pdl_launch, pdl_launch_next, pdl_wait  # noqa: E402

PROGRAMS = 360


@triton.jit
def step_kernel(src, dst, work, PDL: tl.constexpr = False):
    pid = tl.program_id(0)
    offs = pid * 128 + tl.arange(0, 128)
    pdl_wait(PDL)
    v = tl.load(src + offs)
    for _ in range(work):  # a dependent chain: the "main loop"
        v = v * 1.0000001 + 1e-7
    pdl_launch_next(PDL)
    tl.store(dst + offs, v)


def main() -> None:
    bufs = [torch.zeros(PROGRAMS * 128, device="cuda") for _ in range(2)]

    def chain(n, work, pdl):
        def fn():
            for i in range(n):
                step_kernel[(PROGRAMS,)](bufs[i % 2], bufs[(i + 1) % 2], work, **pdl_launch(pdl))
        return fn

    print(f"# {torch.cuda.get_device_name()}  triton {triton.__version__}  {PROGRAMS} programs x 4 warps")
    print("| work per step (FMAs) | n steps | one launch, n x work (us) | n launches, PDL off (us) | n launches, PDL on (us) | per boundary, off / on (us) |")
    print("|---|---|---|---|---|---|")
    for work in (0, 2000, 8000):
        for n in (3, 12):
            one, off, on = (graph_ms([chain(k, w, pdl)]) * 1e3
                            for k, w, pdl in ((1, n * work, False), (n, work, False), (n, work, True)))
            print(f"| {work} | {n} | {one:.1f} | {off:.1f} | {on:.1f} | {(off - one) / (n - 1):.2f} / {(on - one) / (n - 1):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
