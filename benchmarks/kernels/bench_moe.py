"""Device benchmark of the fused MXFP4 MoE decode kernels against the roofline measured in the same run.

Run on a CUDA GPU from the repo root:
    python benchmarks/kernels/bench_moe.py --out DIR [--sweep] [--quick]
Writes DIR/bench_moe.json (every number) and DIR/bench_moe.md (the tables), prints the tables.

What is timed, and how (see docs/KERNELS.md):
- roofline: max of a 4 GiB fp32 copy (bytes read + written) and cuBLAS bf16 GEMV at the
  lm_head shape (1 x 2880 x 201088, weight bytes read).
- one MoE layer = 3 launches (router, gate_up, down), captured in a CUDA graph over L
  layers with distinct weights (so no layer's experts sit in L2), time / L.
- forced routing: the router is set up so M tokens touch exactly D distinct experts;
  t(D) = fixed + per_expert * D is fitted by least squares per M.
- baselines on the same experts: cuBLAS bf16 (weights pre-dequantized) and torch
  dequantize + matmul, both per expert, in CUDA graphs too.
- router: ours (K-split partials as used in the layer, and the one-launch logits op)
  beside cuBLAS bf16 linear, M = 1, 2, 4 (8, 16, 32), rotating over enough router
  weights to exceed L2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gptoss_spark.kernels.moe import DEFAULT_CONFIG, MoeLaunchConfig, launch_plan  # noqa: E402
from gptoss_spark.kernels.mxfp4_layout import mma_layout_for  # noqa: E402
from gptoss_spark.kernels.device.router_logits import router_logits_partial  # noqa: E402
from gptoss_spark.mxfp4 import dequantize_mxfp4  # noqa: E402

# One layer's shapes, timing, roofline and random layers: the same as `gptoss-spark kernels bench`.
from gptoss_spark.kernel_tools.benchmark import (  # noqa: E402
    BIAS_BYTES, DEV, E, EXPERT_BYTES, H, I, TOPK, Layer, decode_stages, graph_ms, roofline, routed)


def forced_router(m, d, e=E, h=H, seed=0):
    """x [m, h] and router (w, b) such that the m tokens' top-4 cover exactly d distinct experts."""
    assert TOPK <= d <= min(e, TOPK * m)
    g = torch.Generator(device="cpu").manual_seed(seed)
    pool = torch.randperm(e, generator=g)[:d]
    x = torch.randn(m, h, generator=g)
    x[:, :m] = 0.0
    x[torch.arange(m), torch.arange(m)] = 10.0
    rw = torch.zeros(e, h)
    for tok in range(m):
        for j in range(TOPK):
            rw[pool[(TOPK * tok + j) % d], tok] = 1.0 + 0.01 * j + 0.001 * tok
    return x.to(DEV, torch.bfloat16), rw.to(DEV, torch.bfloat16), torch.zeros(e, device=DEV, dtype=torch.bfloat16), pool


def distinct_experts(x, layer):
    return routed(x, layer).unique().numel()


# ---------------------------------------------------------------- MoE layer timing
def time_moe(layers, xs, cfg, routers=None, stages=3):
    """Per-layer time (us) of the fused path over len(layers) distinct layers in one graph.

    stages < 3 times only the first 1 (router) or 2 (router, gate_up) launches (decode_stages).
    """

    def call(li):
        router = (routers[li][0], routers[li][1]) if routers else None
        return lambda: decode_stages(xs[li], layers[li], cfg, stages, router)
    calls = [call(li) for li in range(len(layers))]
    return graph_ms(calls) * 1e3 / len(layers)


def check_config(layer, cfg, ms=(1, 2, 4, 8)):
    """The worst relative error of the fused path against the torch reference on one layer (fresh inputs)."""
    from gptoss_spark.kernels import reference
    errs = []
    for m in ms:
        x = torch.randn(m, H, device=DEV).bfloat16()
        out = decode_stages(x, layer, cfg)
        ref = reference.moe_block_ref(x, *layer.args(), TOPK)
        errs.append(((out.float() - ref.float()).norm() / ref.float().norm()).item())
    return max(errs)


SWEEP_TOKENS = (1, 2, 4, 8)


def sweep(layers, log, variants=None):
    """Pick the launch config at M = 1, 2, 4 and 8 (natural routing); returns the best config and every row."""
    results = []
    xs = {m: [torch.randn(m, H, device=DEV).bfloat16() for _ in layers] for m in SWEEP_TOKENS}

    def score(cfg):
        try:
            err = check_config(layers[0], cfg)
            t = {m: time_moe(layers, xs[m], cfg) for m in xs}
        except Exception as e:  # noqa: BLE001 - a config that fails to compile is just skipped
            log(f"  config failed: {cfg}: {str(e).splitlines()[0][:300]}")
            return math.inf
        results.append({"config": cfg.__dict__, **{f"t{m}_us": t[m] for m in t}, "rel_err": err})
        log(f"  {describe(cfg)} -> " + ", ".join(f"M={m} {t[m]:.1f} us" for m in t) + f", rel_err {err:.1e}")
        return sum(t.values()) if err < 5e-3 else math.inf

    best, best_s = DEFAULT_CONFIG, math.inf
    # Each default variant switches off one piece of DEFAULT_CONFIG, so the sweep shows each
    # piece beside the whole; --variants sweeps other config changes. What such sweeps measured
    # and did not keep: docs/NEGATIVE_RESULTS.md.
    if variants is None:
        variants = [{}, {"pdl": False}, {"router_topk_min_rows": 16}, {"gate_up_half_rows_max": 0, "down_k_parts": False},
                    {"topk_in_gate_up_max": 0}, {"mma_sync_m_pad": 16}]  # (the last changes nothing on layout 3)
    for v in variants:
        cfg = MoeLaunchConfig(**{**DEFAULT_CONFIG.__dict__, **v})
        s = score(cfg)
        if s < best_s:
            best, best_s = cfg, s
    return best, results


def describe(cfg):
    """The fields of cfg that differ from DEFAULT_CONFIG, or 'default'."""
    d = {k: v for k, v in cfg.__dict__.items() if DEFAULT_CONFIG.__dict__[k] != v}
    return " ".join(f"{k}={v}" for k, v in d.items()) or "default"


# ---------------------------------------------------------------- baselines
def dequant_experts_bf16(layer, experts):
    w13 = torch.stack([dequantize_mxfp4(layer.w13[e], layer.s13[e], torch.bfloat16) for e in experts])
    w2 = torch.stack([dequantize_mxfp4(layer.w2[e], layer.s2[e], torch.bfloat16) for e in experts])
    return w13, w2


def time_cublas_experts(layers, expert_lists, m_per_expert=1):
    """cuBLAS bf16: per expert gate_up and down GEMMs on pre-dequantized weights. us per layer."""
    data = []
    for lay, ex in zip(layers, expert_lists):
        w13, w2 = dequant_experts_bf16(lay, ex)
        xe = torch.randn(m_per_expert, H, device=DEV).bfloat16()
        he = torch.randn(m_per_expert, I, device=DEV).bfloat16()
        data.append((w13, w2, xe, he))

    def call(d):
        w13, w2, xe, he = d

        def f():
            for j in range(w13.shape[0]):
                torch.nn.functional.linear(xe, w13[j])
                torch.nn.functional.linear(he, w2[j])
        return f
    t = graph_ms([call(d) for d in data]) * 1e3 / len(layers)
    del data
    torch.cuda.empty_cache()
    return t


def time_torch_dequant(layers, expert_lists):
    """torch dequantize (LUT) + bf16 matmul per expert, as an engine without kernels would. us per layer."""
    xe = torch.randn(1, H, device=DEV).bfloat16()
    he = torch.randn(1, I, device=DEV).bfloat16()

    def call(lay, ex):
        def f():
            for e in ex:
                torch.nn.functional.linear(xe, dequantize_mxfp4(lay.w13[e], lay.s13[e], torch.bfloat16))
                torch.nn.functional.linear(he, dequantize_mxfp4(lay.w2[e], lay.s2[e], torch.bfloat16))
        return f
    return graph_ms([call(lay, ex) for lay, ex in zip(layers, expert_lists)], rep=100) * 1e3 / len(layers)


# ---------------------------------------------------------------- router
def bench_router(cfg, ms=(1, 2, 4, 8, 16, 32)):
    copies = 96  # 96 x 0.74 MB > 60 MB L2
    ws = [(torch.randn(E, H, device=DEV) * 0.05).bfloat16() for _ in range(copies)]
    bs = [(torch.randn(E, device=DEV) * 0.1).bfloat16() for _ in range(copies)]

    def per_call_us(call):
        """us per call(w, b), over every router copy in one CUDA graph (so none is in L2)."""
        return graph_ms([lambda w=w, b=b: call(w, b) for w, b in zip(ws, bs)]) * 1e3 / copies

    split = dict(split_k=cfg.router_split_k, block_e=cfg.router_block_e, block_k=cfg.router_block_k)
    rows = []
    for m in ms:
        x = torch.randn(m, H, device=DEV).bfloat16()
        tables = (torch.empty(m, TOPK, dtype=torch.int32, device=DEV), torch.empty(m, TOPK, device=DEV),
                  torch.empty(E, dtype=torch.int32, device=DEV), torch.empty(1, dtype=torch.int32, device=DEV),
                  torch.zeros(1, dtype=torch.int32, device=DEV))
        plan = launch_plan(m, TOPK, cfg)  # as the layer launches it
        ours_split = per_call_us(lambda w, b: router_logits_partial(x, w, b, **split, routing=tables, top_k=TOPK,
                                                                    topk_rows=plan.topk_rows))
        # The partials alone: the router kernel as the layer launches it when gate_up takes the top-k.
        ours_logits = per_call_us(lambda w, b: router_logits_partial(x, w, b, **split))
        ours_one = per_call_us(lambda w, b: router_logits_partial(x, w, b, split_k=1))
        cublas = per_call_us(lambda w, b: torch.nn.functional.linear(x, w, b))

        def torch_topk(w, b):
            lg = torch.nn.functional.linear(x, w, b)
            v, i = lg.float().topk(TOPK, dim=-1)
            return torch.softmax(v, -1), i
        cublas_topk = per_call_us(torch_topk)
        rows.append({"M": m, "ours_ksplit_us": ours_split, "ours_ksplit_logits_only_us": ours_logits,
                     "topk_in_gate_up": plan.topk_in_gate_up, "ours_logits_op_us": ours_one,
                     "cublas_bf16_us": cublas, "cublas_plus_topk_softmax_us": cublas_topk})
    return rows


def fit_line(ds, ts):
    n = len(ds)
    mx, my = sum(ds) / n, sum(ts) / n
    sxx = sum((d - mx) ** 2 for d in ds)
    slope = sum((d - mx) * (t - my) for d, t in zip(ds, ts)) / sxx
    return my - slope * mx, slope


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sweep", action="store_true", help="tune tile sizes first, then benchmark the best")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="natural routing and the M=8 fit only (no baselines, router)")
    ap.add_argument("--variants", type=json.loads, default=None,
                    help='the sweep\'s configs as a JSON list of MoeLaunchConfig changes, e.g. \'[{}, {"pdl": false}]\'')
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    res["mma_layout"] = mma_layout_for(DEV)
    log(f"# {res['device']}  torch {res['torch']}  triton {res['triton']}  {res['time']}  "
        f"layout {res['mma_layout']} ({'wgmma' if res['mma_layout'] == 3 else 'mma.sync, as on GB10'})")
    rf = roofline()
    res["roofline"] = rf
    R = rf["roofline_TBps"]
    log(f"roofline: fp32 copy {rf['copy_fp32_TBps']:.2f} TB/s, cuBLAS GEMV lm_head {rf['cublas_gemv_TBps']:.2f} TB/s "
        f"({rf['cublas_gemv_lm_head_us']:.1f} us) -> {R:.2f} TB/s")

    layers = [Layer(seed=s) for s in range(args.layers)]
    cfg = DEFAULT_CONFIG
    if args.sweep:
        log("## sweep")
        t0 = time.time()
        cfg, sweep_rows = sweep(layers, log, args.variants)
        res["sweep"] = sweep_rows
        log(f"best: {cfg.__dict__}  ({time.time() - t0:.0f} s)")
    res["config"] = cfg.__dict__

    # where the time of one layer goes at one token: the launches timed cumulatively
    log("## stages at M = 1 (natural routing): cumulative us per layer")
    xs1 = [torch.randn(1, H, device=DEV).bfloat16() for _ in layers]
    stages = {n: time_moe(layers, xs1, cfg, stages=n) for n in (1, 2, 3)}
    res["stages_M1_us"] = stages
    log(f"  router + top-k {stages[1]:.1f} | + gate_up {stages[2]:.1f} (gate_up {stages[2] - stages[1]:.1f}) | "
        f"+ down {stages[3]:.1f} (down {stages[3] - stages[2]:.1f})")

    # natural routing, M = 1..32
    log("## per-layer MoE time, natural routing (random x, random router), gpt-oss-120b shapes")
    log("| M | distinct experts (mean) | us/layer | weight bytes/layer (MB) | fraction of roofline |")
    log("|---|---|---|---|---|")
    nat = []
    for m in (1, 2, 3, 4, 8, 16, 32):
        xs = [torch.randn(m, H, device=DEV).bfloat16() for _ in layers]
        d = sum(distinct_experts(x, lay) for x, lay in zip(xs, layers)) / len(layers)
        t = time_moe(layers, xs, cfg)
        byts = d * (EXPERT_BYTES + BIAS_BYTES) + E * H * 2
        frac = byts / (t * 1e-6) / (R * 1e12)
        nat.append({"M": m, "distinct": d, "us": t, "bytes": byts, "fraction": frac})
        log(f"| {m} | {d:.1f} | {t:.1f} | {byts / 1e6:.1f} | {frac:.2f} |")
    res["natural"] = nat

    # forced distinct experts
    log("## forced distinct experts D: per-layer time (us) and fit t = fixed + per_expert * D")
    forced = {}
    fits = {}
    for m, ds in ((1, (4,)), (8, (4, 8, 16, 32))) + (() if args.quick else ((32, (4, 16, 32, 64, 128)),)):
        ts = []
        for d in ds:
            routers, xs = [], []
            for li in range(len(layers)):
                x, rw, rb, _ = forced_router(m, d, seed=li)
                xs.append(x)
                routers.append((rw, rb))
            t = time_moe(layers, xs, cfg, routers)
            ts.append(t)
            forced[f"M{m}_D{d}"] = t
            log(f"  M={m} D={d}: {t:.1f} us")
        if len(ds) > 1:
            fixed, per = fit_line(ds, ts)
            bw = EXPERT_BYTES / (per * 1e-6) / 1e12
            fits[m] = {"fixed_us": fixed, "per_expert_us": per, "marginal_TBps": bw, "fraction": bw / R}
            log(f"  fit M={m}: fixed {fixed:.1f} us + {per:.2f} us/expert -> marginal {bw:.2f} TB/s = "
                f"{bw / R:.2f} of roofline")
    res["forced"] = forced
    res["fits"] = fits
    per = fits[8]["per_expert_us"]
    res["fixed_at_one_token_us"] = forced["M1_D4"] - 4 * per
    log(f"fixed cost at one token: t(M=1,D=4) - 4 x per_expert(M=8 fit) = {res['fixed_at_one_token_us']:.1f} us")

    if args.quick:
        (out / "bench_moe.json").write_text(json.dumps(res, indent=1))
        (out / "bench_moe.md").write_text("\n".join(lines) + "\n")
        return

    # baselines on the same experts
    log("## baselines on the same experts (per layer, us)")
    base = {}
    for d in (4, 8, 16, 32):
        nl = 4 if d <= 8 else 2
        exl = [list(range(d)) for _ in range(nl)]
        t_cub = time_cublas_experts(layers[:nl], exl)
        base[f"cublas_bf16_D{d}"] = t_cub
        log(f"  cuBLAS bf16, D={d} (1 token each): {t_cub:.1f} us/layer = {t_cub / d:.2f} us/expert, "
            f"bf16 bytes {2 * EXPERT_BYTES * 0 + (3 * H * I * 2) / 1e6:.1f} MB/expert -> "
            f"{3 * H * I * 2 / (t_cub / d * 1e-6) / 1e12:.2f} TB/s")
    t_deq = time_torch_dequant(layers[:2], [list(range(4))] * 2)
    base["torch_dequant_matmul_D4"] = t_deq
    log(f"  torch dequantize+matmul, D=4: {t_deq:.1f} us/layer")
    res["baselines"] = base
    cub_per = (base["cublas_bf16_D32"] - base["cublas_bf16_D4"]) / 28
    res["speedup_vs_cublas_marginal"] = cub_per / per
    log(f"  marginal per expert: cuBLAS bf16 {cub_per:.2f} us vs ours {per:.2f} us -> {cub_per / per:.2f}x")

    log("## router (us per call, rotating 96 router weights)")
    log("| M | ours: router + top-k + softmax, one kernel | ours: the router's partials alone | top-k in the layer by | "
        "ours: logits op, 1 launch, split_k=1 | cuBLAS bf16 | cuBLAS + torch topk + softmax |")
    log("|---|---|---|---|---|---|---|")
    rr = bench_router(cfg)
    for r in rr:
        log(f"| {r['M']} | {r['ours_ksplit_us']:.2f} | {r['ours_ksplit_logits_only_us']:.2f} | "
            f"{'gate_up' if r['topk_in_gate_up'] else 'router'} | {r['ours_logits_op_us']:.2f} | "
            f"{r['cublas_bf16_us']:.2f} | {r['cublas_plus_topk_softmax_us']:.2f} |")
    res["router"] = rr

    (out / "bench_moe.json").write_text(json.dumps(res, indent=1))
    (out / "bench_moe.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
