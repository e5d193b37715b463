"""Prefill MoE on the device: moe_prefill.py (tokens grouped by expert) against what the ops do now.

    python3 benchmarks/kernels/bench_prefill.py [--tokens 64,256,1024,4096] [--variants JSON]

Per gpt-oss-120b layer, for each token count: the grouped prefill kernels
(routing in torch included), ops.moe_block_chunked (the decode kernels 32 tokens
at a time: what the vLLM plugin runs for prefill today), and the torch reference
on one small case for correctness. Each variant of PrefillConfig is checked
against the reference before it is timed. Times: each of 2 layers (distinct
weights) timed by triton.testing.do_bench (median of eager calls: a prefill
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
from bench_moe import H, TOPK, Layer, median_ms  # noqa: E402

from gptoss_spark.kernels import reference  # noqa: E402
from gptoss_spark.kernels.moe_prefill import DEFAULT_PREFILL, moe_prefill  # noqa: E402
from gptoss_spark.kernels.mxfp4_layout import mma_layout_for  # noqa: E402
from gptoss_spark.kernels.ops import moe_block_chunked  # noqa: E402


def routed_prefill(x, lay, mma, cfg):
    ids, weights = reference.topk_softmax_ref(reference.router_logits_ref(x, lay.rw, lay.rb), TOPK)
    return moe_prefill(x, ids, weights, *lay.experts(), mma=mma, config=cfg)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="64,256,1024,4096")
    ap.add_argument("--variants", type=json.loads, default=[{}],
                    help="PrefillConfig changes, e.g. '[{}, {\"block_m\": 128}]'")
    args = ap.parse_args()
    mma = mma_layout_for("cuda")
    layers = [Layer(seed=s) for s in range(2)]
    print(f"# {torch.cuda.get_device_name()}  layout {mma}  us per layer (each layer's median, mean of "
          f"{len(layers)} layers)")
    x_check = torch.randn(100, H, device="cuda").bfloat16()
    ref = reference.moe_block_ref(x_check, *layers[0].args(), TOPK)
    print("| tokens | " + " | ".join(f"prefill {v or 'default'}" for v in args.variants)
          + " | decode kernels x32 chunks |")
    print("|---|" + "---|" * (len(args.variants) + 1))
    cfgs = []
    for v in args.variants:
        cfg = replace(DEFAULT_PREFILL, **v)
        err = rel_err(routed_prefill(x_check, layers[0], mma, cfg), ref)
        assert err < 5e-3, (v, err)
        cfgs.append(cfg)
    for m in (int(t) for t in args.tokens.split(",")):
        xs = [torch.randn(m, H, device="cuda").bfloat16() for _ in layers]

        def per_layer_us(call, rep):
            """us of call(x, layer): each layer's median, averaged over the layers."""
            return sum(median_ms(lambda x=x, lay=lay: call(x, lay), rep=rep) for x, lay in zip(xs, layers)) \
                / len(layers) * 1e3
        row = [per_layer_us(lambda x, lay, cfg=cfg: routed_prefill(x, lay, mma, cfg), 50) for cfg in cfgs]
        row.append(per_layer_us(lambda x, lay: moe_block_chunked(x, lay.rw, lay.rb, *lay.experts(), TOPK), 20))
        print(f"| {m} | " + " | ".join(f"{t:.0f}" for t in row) + " |")


if __name__ == "__main__":
    main()
