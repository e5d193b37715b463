"""Which MoE path, and which prefill pair block, is fastest at each token count (device only).

    python3 benchmarks/kernels/sweep_prefill.py [--tokens 16,32,64,128,256,512] [--block-m 8,16,32]

The same protocol as `gptoss-spark kernels bench` (gptoss_spark/kernel_tools/benchmark.py): one
gpt-oss-120b layer, CUDA graph over 8 layers of distinct weights, us per layer. Columns: the
decode kernels (up to 32 tokens) and the prefill kernels (moe_prefill.py) at each
PrefillConfig.block_m. Each variant is checked against the torch reference first. What it picked
is moe_prefill.prefill_config_for and ops.moe_block_any's dispatch (docs/KERNELS.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gptoss_spark.kernels import reference  # noqa: E402
from gptoss_spark.kernel_tools.benchmark import H, TOPK, Layer, graph_ms, rel_err  # noqa: E402
from gptoss_spark.kernels.moe import MAX_DECODE_TOKENS, fused_moe_decode  # noqa: E402
from gptoss_spark.kernels.device.moe_prefill import DEFAULT_PREFILL, moe_prefill_block  # noqa: E402
from gptoss_spark.kernels.mxfp4_layout import mma_layout_for  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="16,32,64,128,256,512")
    ap.add_argument("--block-m", default="8,16,32")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--variants", type=json.loads, default=[{}],
                    help='PrefillConfig changes tried at each block_m, e.g. \'[{}, {"stages": 4}]\'')
    args = ap.parse_args()
    mma = mma_layout_for("cuda")
    lays = [Layer(seed=s) for s in range(args.layers)]
    blocks = [int(b) for b in args.block_m.split(",")]
    print(f"# {torch.cuda.get_device_name()}, layout {mma}: us per layer (relative error vs the reference)")
    cfgs = {f"block_m={b} {json.dumps(v) if v else ''}".strip(): replace(DEFAULT_PREFILL, block_m=b, **v)
            for b in blocks for v in args.variants}
    print("| tokens | decode | " + " | ".join(f"prefill {k}" for k in cfgs) + " |")
    print("|---|---|" + "---|" * len(cfgs))
    for m in (int(t) for t in args.tokens.split(",")):
        g = torch.Generator(device="cuda").manual_seed(1000 + m)
        xs = [torch.randn(m, H, device="cuda", generator=g).bfloat16() for _ in lays]
        ref = reference.moe_block_ref(xs[0], *lays[0].args(), TOPK)
        fns = {}
        if m <= MAX_DECODE_TOKENS:
            fns["decode"] = lambda x, lay: fused_moe_decode(x, lay.rw, lay.rb, lay.sw, TOPK)
        for key, cfg in cfgs.items():
            fns[key] = lambda x, lay, cfg=cfg: moe_prefill_block(x, lay.rw, lay.rb, lay.sw, TOPK, config=cfg)
        cells = []
        for key in ["decode", *cfgs]:
            if key not in fns:
                cells.append("-")
                continue
            f = fns[key]
            try:
                err = rel_err(f(xs[0], lays[0]), ref)
                us = graph_ms([lambda x=x, lay=lay: f(x, lay) for x, lay in zip(xs, lays)]) * 1e3 / len(lays)
                cells.append(f"{us:.1f} ({err:.0e})")
            except Exception as e:  # noqa: BLE001 - a block size the kernels cannot take is a cell, not a crash
                cells.append(f"failed: {str(e).splitlines()[0][:80]}")
        print(f"| {m} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
