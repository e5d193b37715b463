"""Ablation timing (experiment only, not committed): one line per process."""
import os, sys, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.environ.get("ROOT", "exp"), "benchmarks", "kernels"))
import torch
import bench_moe as B
from gptoss_spark.kernels.moe import DEFAULT_CONFIG, MoeLaunchConfig
name = sys.argv[1]
cfg = MoeLaunchConfig(**{**DEFAULT_CONFIG.__dict__, **json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")})
layers = [B.Layer(seed=s) for s in range(8)]
r = {}
for m in (1, 2):
    xs = [torch.randn(m, B.H, device="cuda").bfloat16() for _ in layers]
    r[f"M{m}"] = B.time_moe(layers, xs, cfg)
    if m == 1:
        r["st"] = [B.time_moe(layers, xs, cfg, launches=n) for n in (1, 2)]
def forced(m, d):
    rs, xs = [], []
    for li in range(len(layers)):
        x, rw, rb, _ = B.forced_router(m, d, seed=li)
        xs.append(x); rs.append((rw, rb))
    return B.time_moe(layers, xs, cfg, rs)
r["M1D4"] = forced(1, 4)
ds = (4, 8, 16, 32)
ts = [forced(8, d) for d in ds]
fixed8, per = B.fit_line(ds, ts)
r["per"] = per
r["fixed1"] = r["M1D4"] - 4 * per
st = r["st"]
err = B.check_config(layers[0], cfg)
from gptoss_spark.kernels import reference
from gptoss_spark.kernels.moe import fused_moe_decode
lay = layers[1]
xg = torch.randn(1, B.H, device="cuda").bfloat16()
fused_moe_decode(xg, lay.rw, lay.rb, *lay.experts(), B.TOPK, cfg)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    og = fused_moe_decode(xg, lay.rw, lay.rb, *lay.experts(), B.TOPK, cfg)
gerr = 0.0
for _ in range(20):
    xg.copy_(torch.randn(1, B.H, device="cuda").bfloat16())
    g.replay()
    ref = reference.moe_block_ref(xg, *lay.args(), B.TOPK)
    gerr = max(gerr, ((og.float() - ref.float()).norm() / ref.float().norm()).item())
err = max(err, gerr)
print(f"RESULT {name:14s} M1 {r['M1']:6.1f} M2 {r['M2']:6.1f} | router {st[0]:5.1f} gate_up {st[1]-st[0]:5.1f} "
      f"down {r['M1']-st[1]:5.1f} | M1D4 {r['M1D4']:6.1f} per_expert {per:5.2f} fixed1 {r['fixed1']:5.1f} err {err:.1e}", flush=True)
