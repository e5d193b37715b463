"""Prefill MoE on the device: moe_prefill.py (tokens grouped by expert) beside the decode kernels.

    python3 benchmarks/kernels/bench_prefill.py [--tokens 16,32,64,256,1024,4096] [--variants JSON]

Per gpt-oss-120b layer, for each token count, in one run:
  - the prefill kernels (ops.moe_block past 16 tokens: prefill_routing.py, then moe_prefill.py), per PrefillConfig variant;
  - the decode kernels 32 tokens at a time (what ops.moe_block did for prefill before; up to 32
    tokens what it still does);
  - cuBLAS bf16 doing the same multiply-adds as one dense GEMM ([M top-k, 2880] x [2880, 3 x 2880],
    one weight, no routing, no MXFP4): the compute floor, beside which "/ cuBLAS" is a ratio.
Each variant is checked against the torch reference (100 tokens) before it is timed. Times: each
of 2 layers (distinct weights) timed by triton.testing.do_bench (median of eager calls: a prefill
chunk past vLLM's capture sizes is not in a CUDA graph), averaged.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gptoss_spark.kernel_tools.benchmark import H, TOPK, Layer, median_ms  # noqa: E402

from gptoss_spark.kernels import reference  # noqa: E402
from gptoss_spark.kernels.moe import MAX_DECODE_TOKENS, fused_moe_decode  # noqa: E402
from gptoss_spark.kernels.device.moe_prefill import DEFAULT_PREFILL, moe_prefill_block  # noqa: E402
from gptoss_spark.kernels.mxfp4_layout import mma_layout_for  # noqa: E402


def routed_prefill(x, lay, cfg):
    return moe_prefill_block(x, lay.rw, lay.rb, lay.sw, TOPK, config=cfg)


def decode_chunks(x, lay):
    """The decode kernels over x, MAX_DECODE_TOKENS tokens at a time."""
    return torch.cat([fused_moe_decode(x[s:s + MAX_DECODE_TOKENS], lay.rw, lay.rb, lay.sw, TOPK)
                      for s in range(0, x.shape[0], MAX_DECODE_TOKENS)])


def profile(lay, cfg, token_counts):
    """Per token count: the GPU time of each kernel the prefill path launches, summed over 10 calls / 10."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    for m in token_counts:
        x = torch.randn(m, H, device="cuda").bfloat16()
        routed_prefill(x, lay, cfg)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                routed_prefill(x, lay, cfg)
            torch.cuda.synchronize()
        events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
        total = sum(e.device_time_total for e in events) / 10
        print(f"\n## {m} tokens, {cfg}: {total:.0f} us of kernels per call")
        for e in events[:8]:
            print(f"  {e.device_time_total / 10:8.1f} us  x{e.count // 10}  {e.key[:90]}")


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="16,32,64,256,1024,4096")
    ap.add_argument("--variants", type=json.loads, default=[{}],
                    help="PrefillConfig changes, e.g. '[{}, {\"block_m\": 128}]'")
    ap.add_argument("--profile", action="store_true",
                    help="instead: each kernel's GPU time at each token count (torch.profiler), first variant")
    args = ap.parse_args()
    mma = mma_layout_for("cuda")
    layers = [Layer(seed=s) for s in range(2)]
    if args.profile:
        return profile(layers[0], replace(DEFAULT_PREFILL, **args.variants[0]),
                       [int(t) for t in args.tokens.split(",")])
    print(f"# {torch.cuda.get_device_name()}  layout {mma}  us per layer (each layer's median, mean of "
          f"{len(layers)} layers)")
    x_check = torch.randn(100, H, device="cuda").bfloat16()
    ref = reference.moe_block_ref(x_check, *layers[0].args(), TOPK)
    print("| tokens | " + " | ".join(f"prefill {v or 'default'}" for v in args.variants)
          + " | decode kernels x32 chunks | cuBLAS bf16 dense, same flops | decode / prefill | cuBLAS / prefill |")
    print("|---|" + "---|" * (len(args.variants) + 4))
    cfgs = []
    for v in args.variants:
        cfg = replace(DEFAULT_PREFILL, **v)
        err = rel_err(routed_prefill(x_check, layers[0], cfg), ref)
        assert err < 5e-3, (v, err)
        cfgs.append(cfg)
    for m in (int(t) for t in args.tokens.split(",")):
        xs = [torch.randn(m, H, device="cuda").bfloat16() for _ in layers]

        def per_layer_us(call, rep):
            """us of call(x, layer): each layer's median, averaged over the layers."""
            return sum(median_ms(lambda x=x, lay=lay: call(x, lay), rep=rep) for x, lay in zip(xs, layers)) \
                / len(layers) * 1e3
        row = [per_layer_us(lambda x, lay, cfg=cfg: routed_prefill(x, lay, cfg), 50) for cfg in cfgs]
        row.append(per_layer_us(decode_chunks, 20))
        a = torch.randn(m * TOPK, H, device="cuda").bfloat16()
        w = torch.randn(H, 3 * H, device="cuda").bfloat16()  # gate_up (2 I) and down (H x I), I = H
        row.append(median_ms(lambda: a @ w, rep=50) * 1e3)
        ratios = [row[-2] / row[0], row[-1] / row[0]]
        print(f"| {m} | " + " | ".join(f"{t:.0f}" for t in row) + " | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")


if __name__ == "__main__":
    main()
