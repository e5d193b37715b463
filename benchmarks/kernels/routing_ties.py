"""Tokens whose top-4 experts differ between prefill_routing.route and the reference (device only).

    python3 benchmarks/kernels/routing_ties.py [--tokens 32,256,512,2048]

Both compute the router logits in fp32 from the same bf16 inputs, in a different summation order
(a tensor-core dot against cuBLAS's fp32 GEMM), so a token whose 4th and 5th logits are closer
than that rounding can pick a different 4th expert. For the benchmark's first layer and inputs
(gptoss_spark/kernel_tools/benchmark.py) it prints how many tokens differ, their 4th-5th logit gap, and
the layer's relative error against the reference with and without them: a flipped token moves the
benchmark's error column by itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gptoss_spark.kernels import reference  # noqa: E402
from gptoss_spark.kernels.device import prefill_routing  # noqa: E402
from gptoss_spark.kernel_tools.bench_args import token_list  # noqa: E402
from gptoss_spark.kernel_tools.benchmark import H, TOPK, Layer, ours, rel_err  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=token_list, default=(32, 256, 512, 2048))
    args = ap.parse_args(argv)
    lay = Layer(seed=0)
    for m in args.tokens:
        g = torch.Generator(device="cuda").manual_seed(1000 + m)  # benchmark.bench's inputs
        x = torch.randn(m, H, device="cuda", generator=g).bfloat16()
        ids, _, _ = prefill_routing.route(x, lay.rw, lay.rb, TOPK)
        logits = reference.router_logits_ref(x, lay.rw, lay.rb)
        ref_ids, _ = reference.topk_softmax_ref(logits, TOPK)
        differ = (torch.sort(ids, 1).values != torch.sort(ref_ids, 1).values).any(1)
        top = torch.sort(logits, 1, descending=True).values
        gap = top[:, TOPK - 1] - top[:, TOPK]
        out, ref = ours(lay)(x), reference.moe_block_ref(x, *lay.args(), TOPK)
        keep = ~differ
        print(f"m={m}: tokens with another expert set {int(differ.sum())}; their 4th-5th logit gap "
              f"{gap[differ].tolist()}; min gap over all {gap.min().item():.2e}; rel err all {rel_err(out, ref):.1e}, "
              f"without them {rel_err(out[keep], ref[keep]):.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
