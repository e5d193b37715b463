"""One gpt-oss-120b MoE layer at M tokens, for a profiler: warm-up calls, then one profiled call.

    ncu --clock-control none --kernel-name regex:'router_logits_kernel|moe_gate_up_kernel|moe_down_kernel' \\
        --launch-skip 6 --launch-count 3 --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \\
        python3 benchmarks/kernels/profile_layer.py --tokens 1

Two warm-up calls launch each of the three kernels twice (6 launches to skip);
the third call is the one measured. Random weights, natural routing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernels.bench_moe import DEV, H, TOPK, Layer  # noqa: E402
from gptoss_spark.kernels.moe import fused_moe_decode  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1)
    args = ap.parse_args()
    layer = Layer(seed=0)
    x = torch.randn(args.tokens, H, device=DEV).bfloat16()
    for _ in range(3):
        fused_moe_decode(x, layer.rw, layer.rb, layer.sw, TOPK)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
