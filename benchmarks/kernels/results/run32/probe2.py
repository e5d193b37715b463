"""Per-SM streaming rate of the kernels' loop body (mxfp4_block_dot, C = 4) against programs per SM, at
equal bytes per SM. Experiment (session 10), not product code.

usage: [DISABLE_MMA_V3=1] python3 probe2.py   (from the repository root)

Fixed after its run: the scale buffer was a quarter of the size the blocks read (128 scale bytes per
2 KB block), as in run31's stream_probe.py; layout 3's run read past it without a fault (its numbers
are in probe2_l3.txt), layout 2's faulted. Each iteration also loads the whole activation tile
(C*64 x N bf16, from L2), which the kernels at one token do not (they read one column).
"""
import os, sys
import torch, triton, triton.language as tl
sys.path.insert(0, os.getcwd())
from gptoss_spark.kernels.mxfp4_decode import mxfp4_block_dot
from gptoss_spark.kernels.mxfp4_layout import mma_layout_for

@triton.jit
def stream_ptr(w_ptr, s_ptr, x_ptr, out_ptr, ITERS: tl.constexpr, C: tl.constexpr, N: tl.constexpr, MMA: tl.constexpr):
    pid = tl.program_id(0)
    blk = pid.to(tl.int64) * (ITERS * C)
    offs_k = tl.arange(0, C * 64)
    acc = tl.zeros((64, N), dtype=tl.float32)
    for c0 in range(0, ITERS * C, C):
        xt = tl.load(x_ptr + (c0 * 64 + offs_k)[:, None] * N + tl.arange(0, N)[None, :])
        acc = mxfp4_block_dot(w_ptr + (blk + c0) * 2048, s_ptr + (blk + c0) * 128, xt, acc, C, MMA, 2, False)
    tl.store(out_ptr + pid * 64 * N + tl.arange(0, 64)[:, None] * N + tl.arange(0, N)[None, :], acc)

def time_us(fn, reps=50):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay(); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        g.replay()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / reps / 10

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
                k = stream_ptr[(programs,)](w, sc, x, out, iters, C, n, mma, num_warps=4, num_stages=stages)
                t = time_us(lambda: stream_ptr[(programs,)](w, sc, x, out, iters, C, n, mma, num_warps=4, num_stages=stages))
                print(f"stages {stages} iters/SM {iters_per_sm} P {p} ({iters} it, regs {k.n_regs}, smem {k.metadata.shared//1024} KB): "
                      f"{t:6.2f} us  {mb:.1f} MB  {mb/t/sms*1e3:.1f} GB/s/SM", flush=True)

main()
