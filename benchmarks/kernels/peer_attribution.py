"""Where ours and the peer differ at the token counts where the peer's best is close (device only).

    python3 benchmarks/kernels/peer_attribution.py --peer PEER --out DIR [--tokens 32,256,512] [--repeats 5]

Same protocol as `gptoss-spark kernels bench` (gptoss_spark/kernel_tools/benchmark.py: one gpt-oss-120b
MoE layer, 8 layers of distinct weights, us per layer), three questions per token count:

1. **Noise.** Ours and the peer's nw4 (its best configuration) timed alternately `--repeats`
   times, each a CUDA graph replay: the spread of the ratio says how much of a gap is the run.
2. **Per kernel.** Each side run eagerly under torch.profiler: the device time of every kernel it
   launches, summed per layer, grouped into stages (routing, gate_up, down, combine). Which stage
   holds the gap; kernel time against graph time says how much is launch gaps.
3. **The peer's schedule.** The OptFlags triton_kernels chose for each of its two matmuls, and the
   peer re-timed under constraints (persistent or not, block_m): how much its choice is worth.

Writes DIR/peer_attribution.json (every number) and DIR/peer_attribution.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gptoss_spark.kernel_tools import peer  # noqa: E402
from gptoss_spark.kernels import reference  # noqa: E402
from gptoss_spark.kernel_tools.benchmark import H, TOPK, Layer, graph_ms, ours, rel_err  # noqa: E402
from gptoss_spark.kernel_tools.bench_args import token_list  # noqa: E402
from gptoss_spark.kernels.device.moe_prefill import prefill_config_for  # noqa: E402
from gptoss_spark.kernels.mxfp4_layout import mma_layout_for  # noqa: E402

# Stage of a kernel by its name. Ours: moe_prefill.py's / moe_gate_up.py's / moe_down.py's kernels, the
# rest torch (routing, pair sort, combine). The peer: matmul_ogs with the fused SwiGLU is gate_up, the other
# matmul_ogs is down, the rest its topk, ragged metadata and reduce.
OTHER = "routing, sort, combine"


def stage_of(kernel: str) -> str:
    k = kernel.lower()
    if "gate_up" in k or ("matmul" in k and "swiglu" in k):
        return "gate_up"
    if "moe_prefill_down" in k or "moe_down" in k or "matmul" in k:
        return "down"
    return OTHER


PEER_VARIANTS = {
    "default": {},
    "not persistent": {"is_persistent": False},
    "persistent": {"is_persistent": True},
    "block_m=16": {"block_m": 16},
    "block_m=32": {"block_m": 32},
    "block_m=64": {"block_m": 64},
    "block_m=128": {"block_m": 128},
}


def kernel_times(calls, reps: int) -> dict[str, float]:
    """us per call-list run of each CUDA kernel name (eager, under torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    for c in calls:
        c()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for c in calls:
                c()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        us = getattr(ev, "self_device_time_total", None)
        if us is None:
            us = ev.self_cuda_time_total
        if us > 0:
            out[ev.key] += us / reps
    return dict(out)


def peer_flags(tk, fn) -> list[dict]:
    """The OptFlags matmul_ogs chose on fn's run, one per matmul call."""
    import triton_kernels.matmul_ogs as mo
    seen, orig = [], mo.make_opt_flags

    def record(*a, **kw):
        f = orig(*a, **kw)
        seen.append({k: v for k, v in f.__dict__.items() if k != "target_kernel_kwargs"})
        return f
    mo.make_opt_flags = record
    try:
        fn()
    finally:
        mo.make_opt_flags = orig
    return seen


def constrained(tk, constraints: dict):
    tk.opt_flags.reset_opt_flags_constraints()
    if torch.cuda.get_device_capability()[0] == 9:
        tk.opt_flags.update_opt_flags_constraints({"split_k": 1})  # vLLM's pin on Hopper (peer.swizzle)
    tk.opt_flags.update_opt_flags_constraints(constraints)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", type=token_list, default=(32, 256, 512))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--profile-reps", type=int, default=10)
    args = ap.parse_args(argv)
    tk = peer.load(args.peer)
    mma = mma_layout_for("cuda")
    lays = [Layer(seed=s) for s in range(args.layers)]
    peers = {nw: [peer.PeerLayer(tk, lay, num_warps=nw) for lay in lays] for nw in (4, 8)}
    res = {"device": torch.cuda.get_device_name(), "mma_layout": mma, "peer_version": tk.version,
           "layers": args.layers, "rows": []}
    md = [f"# Ours against the peer, by stage: {res['device']}, layout {mma}, triton_kernels {tk.version}", ""]
    for m in args.tokens:
        g = torch.Generator(device="cuda").manual_seed(1000 + m)
        xs = [torch.randn(m, H, device="cuda", generator=g).bfloat16() for _ in lays]
        ref = reference.moe_block_ref(xs[0], *lays[0].args(), TOPK)
        our_fns = [ours(lay) for lay in lays]
        our_calls = [lambda f=f, x=x: f(x) for f, x in zip(our_fns, xs)]
        row = {"tokens": m, "ours_config": prefill_config_for(m, mma).__dict__ if m > 16 else "decode"}

        # 1. noise: alternate ours and the peer's nw4 (its best at these sizes), default constraints.
        constrained(tk, {})
        peer_calls = {nw: [lambda p=p, x=x: p(x) for p, x in zip(pl, xs)] for nw, pl in peers.items()}
        t_ours, t_peer = [], []
        for _ in range(args.repeats):
            t_ours.append(graph_ms(our_calls) * 1e3 / len(lays))
            t_peer.append(graph_ms(peer_calls[4]) * 1e3 / len(lays))
        ratios = sorted(o / p for o, p in zip(t_ours, t_peer))
        row["noise"] = {"ours_us": t_ours, "peer_nw4_us": t_peer, "ratios": ratios}

        # 2. per kernel, eager.
        per_kernel = {"ours": kernel_times(our_calls, args.profile_reps)}
        per_kernel["peer_nw4"] = kernel_times(peer_calls[4], args.profile_reps)
        row["kernels"] = {side: {k: v / len(lays) for k, v in kt.items()} for side, kt in per_kernel.items()}

        # 3. the peer's schedule.
        row["peer_flags"] = {f"nw{nw}": peer_flags(tk, lambda: pl[0](xs[0])) for nw, pl in peers.items()}
        row["stages"] = {}
        for side, kt in row["kernels"].items():
            st: dict[str, float] = defaultdict(float)
            for k, v in kt.items():
                st[stage_of(k)] += v
            row["stages"][side] = dict(st)
        row["variants"] = {}
        for name, cons in PEER_VARIANTS.items():
            for nw, pl in peers.items():
                key = f"nw{nw} {name}"
                try:
                    constrained(tk, cons)
                    err = rel_err(pl[0](xs[0]), ref)
                    flags = peer_flags(tk, lambda: pl[0](xs[0]))
                    us = graph_ms(peer_calls[nw]) * 1e3 / len(lays)
                    row["variants"][key] = {"us": us, "rel_err": err,
                                            "flags": [{k: f[k] for k in ("block_m", "block_n", "block_k", "num_warps",
                                                                         "num_stages", "is_persistent")}
                                                      for f in flags]}
                except Exception as e:  # noqa: BLE001 - a constraint the peer cannot take is a cell
                    row["variants"][key] = {"error": str(e).splitlines()[0][:200] if str(e) else type(e).__name__}
        constrained(tk, {})
        res["rows"].append(row)
        md += render_row(row)
        print("\n".join(render_row(row)), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peer_attribution.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (args.out / "peer_attribution.md").write_text("\n".join(md) + "\n")
    return 0


def render_row(row: dict) -> list[str]:
    n = row["noise"]
    r = n["ratios"]
    out = [f"## {row['tokens']} tokens (ours: {row['ours_config']})", "",
           f"ours / peer nw4 over {len(r)} alternating graph timings: min {r[0]:.3f}, median {r[len(r) // 2]:.3f}, "
           f"max {r[-1]:.3f} (ours {min(n['ours_us']):.1f}-{max(n['ours_us']):.1f} us, "
           f"peer {min(n['peer_nw4_us']):.1f}-{max(n['peer_nw4_us']):.1f} us)", "",
           "| stage | ours us | peer nw4 us |", "|---|---|---|"]
    st = row["stages"]
    for s in sorted(set(st["ours"]) | set(st["peer_nw4"])):
        out.append(f"| {s} | {st['ours'].get(s, 0):.1f} | {st['peer_nw4'].get(s, 0):.1f} |")
    out.append(f"| kernels, total | {sum(st['ours'].values()):.1f} | {sum(st['peer_nw4'].values()):.1f} |")
    out += ["", "| side | kernel | us per layer |", "|---|---|---|"]
    for side, kt in row["kernels"].items():
        for k, v in sorted(kt.items(), key=lambda kv: -kv[1]):
            out.append(f"| {side} | `{k[:90]}` | {v:.1f} |")
    out += ["", "| peer variant | us | rel. err | flags (gate_up; down) |", "|---|---|---|---|"]
    for key, v in row["variants"].items():
        if "error" in v:
            out.append(f"| {key} | - | - | {v['error']} |")
        else:
            fl = "; ".join(" ".join(f"{k}={x}" for k, x in f.items()) for f in v["flags"])
            out.append(f"| {key} | {v['us']:.1f} | {v['rel_err']:.1e} | {fl} |")
    return out + [""]


if __name__ == "__main__":
    raise SystemExit(main())
