"""Per-SM streaming rate of a gate_up-like loop (MXFP4 bytes -> the kernels' PTX decode -> tensor-core
dot with a token tile), weights loaded by pointer (cp.async, as the kernels do) or by tensor descriptor
(TMA), the same bytes per program. Experiment (session 9), not product code.

usage: [DISABLE_MMA_V3=1] python3 stream_probe.py   (run from the repository root)
"""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())
from gptoss_spark.kernels.mxfp4_decode import _decoded_dot, mxfp4_block_dot  # noqa: E402
from gptoss_spark.kernels.mxfp4_layout import mma_layout_for  # noqa: E402

@triton.jit
def stream_ptr(w_ptr, s_ptr, x_ptr, out_ptr, ITERS: tl.constexpr, C: tl.constexpr, N: tl.constexpr,
               MMA: tl.constexpr):
    """The kernels' own loop body (mxfp4_block_dot): bytes and scales by pointer, pipelined by Triton."""
    pid = tl.program_id(0)
    blk = pid.to(tl.int64) * (ITERS * C)
    offs_k = tl.arange(0, C * 64)
    acc = tl.zeros((64, N), dtype=tl.float32)
    for c0 in range(0, ITERS * C, C):
        xt = tl.load(x_ptr + (c0 * 64 + offs_k)[:, None] * N + tl.arange(0, N)[None, :])
        acc = mxfp4_block_dot(w_ptr + (blk + c0) * 2048, s_ptr + (blk + c0) * 128, xt, acc, C, MMA, 2, False)
    tl.store(out_ptr + pid * 64 * N + tl.arange(0, 64)[:, None] * N + tl.arange(0, N)[None, :], acc)


@triton.jit
def stream_tma(w_ptr, s_ptr, x_ptr, out_ptr, total_rows, ITERS: tl.constexpr, C: tl.constexpr, N: tl.constexpr,
               MMA: tl.constexpr):
    """The same, the bytes by tensor descriptor (TMA) as [C*128 rows, 16 bytes] tiles; scales by pointer."""
    pid = tl.program_id(0)
    R: tl.constexpr = C * 128
    desc = tl.make_tensor_descriptor(w_ptr, shape=[total_rows, 16], strides=[16, 1], block_shape=[R, 16])
    row0 = pid * (ITERS * R)
    s_ptr += pid.to(tl.int64) * (ITERS * C * 128)
    rows = tl.arange(0, R)
    offs_k = tl.arange(0, C * 64)
    acc = tl.zeros((64, N), dtype=tl.float32)
    for i in tl.range(0, ITERS, num_stages=3):
        xt = tl.load(x_ptr + (i * C * 64 + offs_k)[:, None] * N + tl.arange(0, N)[None, :])
        q = desc.load([row0 + i * R, 0])
        e = tl.load(s_ptr + i * C * 128 + (rows // 4)[:, None] * 4 + tl.arange(0, 4)[None, :])
        acc = _decoded_dot(q, e, xt, acc, C, MMA, 2, False)
    tl.store(out_ptr + pid * 64 * N + tl.arange(0, 64)[:, None] * N + tl.arange(0, N)[None, :], acc)


def time_us(fn, reps=100):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / reps / 10


def main():
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    mma = mma_layout_for("cuda")
    n = 16 if mma == 3 else 8  # the kernels' one-token token columns on each layout
    C, ITERS = 2, 24  # 24 x 4 KB = 96 KB per program, as a one-token half-row gate_up program (C = 4 there)
    x = (torch.randn(ITERS * C * 64, n, device="cuda") * 0.01).bfloat16()
    print(f"layout {mma}, {n} token columns, C = {C}, {ITERS * C * 2} KB per program", flush=True)
    for programs in (360, 2 * sms, 3 * sms):
        n_rows = programs * ITERS * C * 128
        w = torch.randint(0, 255, (n_rows, 16), dtype=torch.uint8, device="cuda")
        sc = torch.full((n_rows // 16, 4), 126, dtype=torch.uint8, device="cuda")  # factor 2**-1 ... finite
        out = torch.empty(programs * 64 * n, dtype=torch.float32, device="cuda")
        mb = w.numel() / 1e6
        for name, fn in (("cp.async", lambda: stream_ptr[(programs,)](w, sc, x, out, ITERS, C, n, mma, num_warps=4,
                                                                       num_stages=3)),
                         ("tma", lambda: stream_tma[(programs,)](w, sc, x, out, n_rows, ITERS, C, n, mma, num_warps=4,
                                                                num_stages=3))):
            try:
                t = time_us(fn)
                print(f"{name:9s} programs {programs:4d} ({programs / sms:.2f} per SM): {t:6.1f} us for {mb:.1f} MB "
                      f"-> {mb / t:.2f} TB/s, {mb / t / sms * 1e3:.1f} GB/s per SM", flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on to the next variant
                print(f"{name:9s} programs {programs:4d}: failed: {str(e).splitlines()[0][:300]}", flush=True)


if __name__ == "__main__":
    main()
