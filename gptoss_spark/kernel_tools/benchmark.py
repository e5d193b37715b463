"""The kernel benchmark a GPU owner runs: our MoE layer beside the peer, cuBLAS bf16 and the roofline.

    gptoss-spark kernels bench --out DIR [--peer PATH] [--tokens 1,2,4,8,16,32,64,128,256,512]

One gpt-oss-120b MoE layer (router, top-4, experts, combine) at each token count,
per layer, in one process and one run, so the columns are ratios that hold even
when a machine's absolute speed drifts:

- ours: ops.moe_block_any (the decode kernels up to 32 tokens, the prefill kernels past
  that), on the experts repacked for this device's layout (mxfp4_layout.mma_layout_for);
- peer: OpenAI's triton_kernels driven as vLLM drives it (peer.py), when --peer names it;
- cuBLAS bf16: the same tokens' GEMMs per routed expert on weights dequantized beforehand,
  routing precomputed (a GEMM-only baseline that reads 4x the bytes);
- roofline: the bytes a layer must read (each distinct expert once, plus the router) at the
  best of a 4 GiB copy and cuBLAS's lm_head GEMV, measured in the same run.

Each time is the replay of one CUDA graph over `layers` layers of distinct random
weights (so no layer's experts sit in L2), divided by `layers`. Results: DIR/kernels_bench.json
(every number) and DIR/kernels_bench.md (the table). benchmarks/kernels/bench_moe.py
builds its deeper studies (forced routing, fits, sweeps) on the same pieces.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import triton
from triton.testing import do_bench

from ..mxfp4 import dequantize_mxfp4
from .bench_args import DEFAULT_TOKENS, add_bench_arguments
from ..kernels.moe import DecodeLaunches, MoeLaunchConfig
from ..kernels.mxfp4_layout import SwizzledExperts, mma_layout_for
from ..kernels.ops import moe_block_any

DEV = "cuda"
H = I = 2880
E, TOPK = 128, 4
EXPERT_BYTES = (2 * I * H // 2 + 2 * I * H // 32) + (H * I // 2 + H * I // 32)  # MXFP4 blocks + scales
BIAS_BYTES = (2 * I + H) * 2
ROUTER_BYTES = E * H * 2
LAYOUT_NAMES = {2: "mma.sync (GB10's)", 3: "wgmma (Hopper's)"}


def median_ms(fn, rep=200):
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def graph_ms(calls, rep=200):
    """Capture calls (a list of no-arg callables) in one CUDA graph; median replay time in ms."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    torch.cuda.synchronize()
    t = median_ms(g.replay, rep=rep)
    del g
    return t


def roofline() -> dict:
    """Read bandwidth ceilings of this GPU: a 4 GiB fp32 copy (read + write) and cuBLAS's bf16 GEMV
    on the lm_head shape (weight bytes read); the best of the two is the roofline."""
    n = (4 << 30) // 4
    a = torch.empty(n, dtype=torch.float32, device=DEV).uniform_()
    b = torch.empty_like(a)
    t_copy = median_ms(lambda: b.copy_(a))
    copy_tbs = 2 * a.numel() * 4 / (t_copy * 1e-3) / 1e12
    a = b = None  # free the 8 GiB (not del: the lambda above still names them)
    w = torch.randn(201088, 2880, device=DEV, dtype=torch.bfloat16)
    x = torch.randn(1, 2880, device=DEV, dtype=torch.bfloat16)
    t_gemv = median_ms(lambda: torch.nn.functional.linear(x, w))
    gemv_tbs = w.numel() * 2 / (t_gemv * 1e-3) / 1e12
    w = None
    torch.cuda.empty_cache()
    return {"copy_fp32_4GiB_us": t_copy * 1e3, "copy_fp32_TBps": copy_tbs,
            "cublas_gemv_lm_head_us": t_gemv * 1e3, "cublas_gemv_TBps": gemv_tbs,
            "roofline_TBps": max(copy_tbs, gemv_tbs)}


class Layer:
    """One gpt-oss-120b MoE layer of random MXFP4 experts in the checkpoint layout, plus our repack."""

    def __init__(self, e=E, h=H, i=I, seed=0):
        g = torch.Generator(device=DEV).manual_seed(seed)
        self.w13 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, device=DEV, generator=g)
        self.s13 = torch.randint(118, 125, (e, 2 * i, h // 32), dtype=torch.uint8, device=DEV, generator=g)
        self.w2 = torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, device=DEV, generator=g)
        self.s2 = torch.randint(118, 125, (e, h, i // 32), dtype=torch.uint8, device=DEV, generator=g)
        self.b13 = (torch.randn(e, 2 * i, device=DEV, generator=g) * 0.1).bfloat16()
        self.b2 = (torch.randn(e, h, device=DEV, generator=g) * 0.1).bfloat16()
        self.rw = (torch.randn(e, h, device=DEV, generator=g) * 0.05).bfloat16()
        self.rb = (torch.randn(e, device=DEV, generator=g) * 0.1).bfloat16()
        # The kernels read the experts repacked once (mxfp4_layout.py); baselines and the reference read these.
        self.sw = SwizzledExperts.from_checkpoint(self.w13, self.s13, self.b13, self.w2, self.s2, self.b2)

    def args(self):
        """Checkpoint layout (reference, baselines)."""
        return (self.rw, self.rb, self.w13, self.s13, self.b13, self.w2, self.s2, self.b2)


def routed(x, layer) -> torch.Tensor:
    """The top-4 expert ids [M, 4] of x: the reference's routing (fp32 logits)."""
    from ..kernels.reference import router_logits_ref, topk_softmax_ref
    return topk_softmax_ref(router_logits_ref(x, layer.rw, layer.rb), TOPK)[0]


def layer_bytes(distinct: float) -> float:
    """What one layer must read: each distinct expert's MXFP4 weights and biases once, plus the router."""
    return distinct * (EXPERT_BYTES + BIAS_BYTES) + ROUTER_BYTES


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def decode_stages(x: torch.Tensor, layer: Layer, config: MoeLaunchConfig, stages: int = 3,
                  router: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor | None:
    """The first `stages` launches of one decode layer with config (1: router, 2: + gate_up,
    3: + down, returning the output), on this device's layout; router = (weight, bias) in place of
    the layer's. bench_moe.py times them cumulatively to see where a layer's time goes, and sweeps
    configs through this; production calls moe.fused_moe_decode, which runs all three on the
    defaults."""
    rw, rb = router if router is not None else (layer.rw, layer.rb)
    call = DecodeLaunches(x, rw, rb, layer.sw, TOPK, config)
    call.router()
    if stages >= 2:
        call.gate_up()
    return call.down() if stages >= 3 else None


def ours(layer: Layer) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: moe_block_any(x, layer.rw, layer.rb, layer.sw, TOPK)


class CublasExperts:
    """cuBLAS bf16 GEMMs for x's routed (token, expert) pairs, weights dequantized and routing done
    beforehand: only the per-expert gate_up and down GEMMs are timed."""

    def __init__(self, layer: Layer, x: torch.Tensor):
        ids = routed(x, layer)
        self.x = x
        self.work = []
        for e in ids.unique().tolist():
            rows = (ids == e).any(dim=-1).nonzero().flatten()
            w13 = dequantize_mxfp4(layer.w13[e], layer.s13[e], torch.bfloat16)
            w2 = dequantize_mxfp4(layer.w2[e], layer.s2[e], torch.bfloat16)
            h = torch.randn(rows.numel(), I, device=DEV).bfloat16()
            self.work.append((rows, w13, w2, h))

    def __call__(self):
        for rows, w13, w2, h in self.work:
            torch.nn.functional.linear(self.x.index_select(0, rows), w13)
            torch.nn.functional.linear(h, w2)


@dataclass
class Row:
    tokens: int
    distinct: float
    bytes: float
    roofline_us: float
    ours_us: float
    ours_err: float
    peer: dict[str, float] = field(default_factory=dict)       # config -> us
    peer_err: dict[str, float] = field(default_factory=dict)
    cublas_us: float | None = None

    def fraction(self, us: float) -> float:
        return self.roofline_us / us


def bench(tokens=DEFAULT_TOKENS, *, peer_path: Path | None = None, peer_warps=(8, 4), layers: int = 8,
          cublas_layers: int = 2, log: Callable[[str], None] = print) -> dict:
    """Run the side-by-side benchmark; returns every number (see the module docstring)."""
    from ..kernels import reference
    layout = mma_layout_for(DEV)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "mma_layout": layout,
           "layers": layers}
    log(f"# {res['device']}  torch {res['torch']}  triton {res['triton']}  layout {layout} "
        f"({LAYOUT_NAMES.get(layout, '?')})")
    peers, tk = {}, None
    if peer_path is not None:
        from . import peer
        tk = peer.load(peer_path)
        res["peer"] = {"name": "triton_kernels", "path": str(peer_path), "version": tk.version}
    rf = roofline()
    res["roofline"] = rf
    bw = rf["roofline_TBps"] * 1e12
    log(f"roofline: {rf['roofline_TBps']:.2f} TB/s (fp32 copy {rf['copy_fp32_TBps']:.2f}, "
        f"cuBLAS lm_head GEMV {rf['cublas_gemv_TBps']:.2f})")
    lays = [Layer(seed=s) for s in range(layers)]
    if tk is not None:
        for nw in peer_warps:
            peers[f"nw{nw}"] = [peer.PeerLayer(tk, lay, num_warps=nw) for lay in lays]
    rows = []
    for m in tokens:
        g = torch.Generator(device=DEV).manual_seed(1000 + m)
        xs = [torch.randn(m, H, device=DEV, generator=g).bfloat16() for _ in lays]
        distinct = sum(routed(x, lay).unique().numel() for x, lay in zip(xs, lays)) / len(lays)
        byts = layer_bytes(distinct)
        ref = reference.moe_block_ref(xs[0], *lays[0].args(), TOPK)
        fns = [ours(lay) for lay in lays]
        row = Row(m, distinct, byts, byts / bw * 1e6,
                  ours_us=graph_ms([lambda f=f, x=x: f(x) for f, x in zip(fns, xs)]) * 1e3 / len(lays),
                  ours_err=rel_err(fns[0](xs[0]), ref))
        for name, pl in peers.items():
            try:
                row.peer[name] = graph_ms([lambda p=p, x=x: p(x) for p, x in zip(pl, xs)]) * 1e3 / len(lays)
                row.peer_err[name] = rel_err(pl[0](xs[0]), ref)
            except Exception as e:  # noqa: BLE001 - the peer failing one shape must not lose the run
                log(f"  peer {name} failed at {m} tokens: {str(e).splitlines()[0][:300]}")
                row.peer[name] = row.peer_err[name] = float("nan")
        if cublas_layers:
            cub = [CublasExperts(lay, x) for lay, x in zip(lays[:cublas_layers], xs)]
            row.cublas_us = graph_ms(cub) * 1e3 / len(cub)
            del cub
            torch.cuda.empty_cache()
        rows.append(row)
        log(render_row(row))
    res["rows"] = [r.__dict__ for r in rows]
    return res


def _fmt(us, frac):
    return f"{us:.1f} ({frac:.2f})"


def table_header(peer_names) -> list[str]:
    cols = ["tokens", "distinct experts", "roofline us", "ours us (of roofline)"]
    cols += [f"peer {n} us (of roofline)" for n in peer_names]
    cols += ["ours / best peer"] if peer_names else []
    cols += ["cuBLAS bf16 us", "ours rel. err"] + [f"peer {n} rel. err" for n in peer_names]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def render_row(r: Row) -> str:
    cells = [str(r.tokens), f"{r.distinct:.1f}", f"{r.roofline_us:.1f}", _fmt(r.ours_us, r.fraction(r.ours_us))]
    cells += [_fmt(us, r.fraction(us)) for us in r.peer.values()]
    if r.peer:
        cells.append(f"{r.ours_us / min(r.peer.values()):.2f}")
    cells.append("-" if r.cublas_us is None else f"{r.cublas_us:.1f}")
    cells.append(f"{r.ours_err:.1e}")
    cells += [f"{e:.1e}" for e in r.peer_err.values()]
    return "| " + " | ".join(cells) + " |"


def render(res: dict) -> str:
    rows = [Row(**r) for r in res["rows"]]
    peer_names = list(rows[0].peer) if rows else []
    rf = res["roofline"]
    head = [f"# MoE layer, gpt-oss-120b shapes: {res['device']}, layout {res['mma_layout']} "
            f"({LAYOUT_NAMES.get(res['mma_layout'], '?')}), {res['time']}",
            "",
            f"us per layer (CUDA graph over {res['layers']} layers of distinct weights); in brackets the fraction of "
            f"the roofline, {rf['roofline_TBps']:.2f} TB/s measured in the same run. "
            + (f"Peer: triton_kernels {res['peer']['version']} as vLLM drives it (nwN: the scale swizzle's num_warps; "
               "vLLM uses 8)." if "peer" in res else "No peer given (--peer PATH)."),
            ""]
    return "\n".join(head + table_header(peer_names) + [render_row(r) for r in rows]) + "\n"


def write(res: dict, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    j, md = out / "kernels_bench.json", out / "kernels_bench.md"
    j.write_text(json.dumps(res, indent=1) + "\n")
    md.write_text(render(res))
    return j, md


def run(args) -> int:
    res = bench(args.tokens, peer_path=args.peer, layers=args.layers)
    j, md = write(res, args.out)
    print(f"wrote {j} and {md}")
    return 0


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m gptoss_spark.kernel_tools.benchmark",
                                 description=__doc__.split("\n")[0])
    add_bench_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
