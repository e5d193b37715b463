"""Per-SM streaming rate of the kernels' loop body (mxfp4_block_dot, C = 4) against programs per SM, at
equal bytes per SM. Experiment (session 10), not product code.

usage: [DISABLE_MMA_V3=1] python3 probe2.py   (from the repository root)

Fixed after its run: the scale buffer was a quarter of the size the blocks read (128 scale bytes per
2 KB block), as in run31's stream_probe.py; layout 3's run read past it without a fault (its numbers
are in probe2_l3.txt), layout 2's faulted. Each iteration also loads the whole activation tile
(C*64 x N bf16, from L2), which the kernels at one token do not (they read one column). The kernel
and the timer are run31's (the run used a copy of them).
"""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "run31"))
from gptoss_spark.kernels.mxfp4_layout import mma_layout_for  # noqa: E402
from stream_probe import stream_ptr, time_us  # noqa: E402  (run31's loop-body kernel and timer)


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    mma = mma_layout_for("cuda")
    n = 16 if mma == 3 else 8
    C = 4
    print(f"layout {mma}, N {n}, C {C}", flush=True)
    for stages in (3, 4):
        for iters_per_sm in (48, 96):
            for p in (2, 3, 4, 6, 8):
                iters = iters_per_sm // p
                programs = p * sms
                n_rows = programs * iters * C * 128
                x = (torch.randn(iters * C * 64, n, device="cuda") * 0.01).bfloat16()
                w = torch.randint(0, 255, (n_rows, 16), dtype=torch.uint8, device="cuda")
                sc = torch.full((n_rows // 4, 4), 126, dtype=torch.uint8, device="cuda")  # 128 bytes per block
                out = torch.empty(programs * 64 * n, dtype=torch.float32, device="cuda")
                mb = w.numel() / 1e6
                def launch():
                    return stream_ptr[(programs,)](w, sc, x, out, iters, C, n, mma, num_warps=4, num_stages=stages)
                k = launch()
                t = time_us(launch, reps=50)
                print(f"stages {stages} iters/SM {iters_per_sm} P {p} ({iters} it, regs {k.n_regs}, smem {k.metadata.shared//1024} KB): "
                      f"{t:6.2f} us  {mb:.1f} MB  {mb/t/sms*1e3:.1f} GB/s/SM", flush=True)


if __name__ == "__main__":
    main()
