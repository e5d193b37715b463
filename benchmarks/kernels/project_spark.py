"""Projected Spark decode rate from a kernel benchmark result: a PROJECTION, not a Spark measurement.

    python3 benchmarks/kernels/project_spark.py benchmarks/kernels/results/fixed_cost/layout2/bench_moe.json

Model, per MoE layer: F + D x 13.2 MB / (eta x 250 GB/s), with F the fixed cost
measured on the device (not scaled: it is launches and latency, not bytes) and
eta the fraction of GB10's ~250 GB/s the expert reads reach: from the device's
measured fraction of its own roofline (low end) to 0.85 (what the seed's CUTLASS
path reached, high end). Everything outside the MoE is taken as the seed measured
it on a Spark (docs/HARDWARE.md): plain 64.3 tok/s with 371 us of MoE per layer;
spec K=1 68.9 tok/s with 616 us per layer, 3.64 ms of other work per pass and
1.779 tokens per pass (the split of the seed's pass that docs/KERNELS.md uses).
"""

from __future__ import annotations

import json
import sys

LAYERS = 36
EXPERT_MB = 13.2
SPARK_GBPS = 250.0
PLAIN = {"seed_tps": 64.3, "seed_moe_us": 371.0, "distinct": 4.0}
SPEC = {"seed_tps": 68.9, "other_ms": 3.64, "tokens_per_pass": 1.779, "distinct": 7.8}


def moe_us(fixed_us: float, distinct: float, eta: float) -> float:
    return fixed_us + distinct * EXPERT_MB * 1e6 / (eta * SPARK_GBPS * 1e9) * 1e6


def plain_tps(layer_us: float) -> float:
    other_ms = 1e3 / PLAIN["seed_tps"] - LAYERS * PLAIN["seed_moe_us"] / 1e3
    return 1e3 / (other_ms + LAYERS * layer_us / 1e3)


def spec_tps(layer_us: float) -> float:
    return SPEC["tokens_per_pass"] * 1e3 / (SPEC["other_ms"] + LAYERS * layer_us / 1e3)


def main(path: str) -> None:
    res = json.loads(open(path).read())
    fixed = res["fixed_at_one_token_us"]
    measured_eta = res["fits"]["8"]["fraction"]  # JSON object keys are strings
    print(f"PROJECTION from {res['device']} ({path}): F = {fixed:.1f} us, eta {measured_eta:.2f} .. 0.85")
    print("| profile | seed (Spark, measured by others) | eta | MoE us/layer | projected tok/s |")
    print("|---|---|---|---|---|")
    for eta in (measured_eta, 0.85):
        t = moe_us(fixed, PLAIN["distinct"], eta)
        print(f"| plain, M=1, D=4 | {PLAIN['seed_tps']} tok/s | {eta:.2f} | {t:.0f} | {plain_tps(t):.1f} |")
    for eta in (measured_eta, 0.85):
        t = moe_us(fixed, SPEC["distinct"], eta)
        print(f"| spec K=1, M=2, D=7.8 | {SPEC['seed_tps']} tok/s | {eta:.2f} | {t:.0f} | {spec_tps(t):.1f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/kernels/results/fixed_cost/layout2/bench_moe.json")
