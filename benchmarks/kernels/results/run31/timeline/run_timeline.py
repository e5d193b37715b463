"""Per-program timestamps of the three kernels at one token, 4 layers in one CUDA graph (stamps.diff applied).

usage: python3 run_timeline.py OUT.pt [M]; then analyze.py (on a .pt or this folder's .npz)."""
import os, sys
# The tree this copy of the script sits in (benchmarks/kernels/results/run31/timeline/ -> its root), so that
# a copy with the stamps applied times its own kernels. (Until session 11 this went up 4 levels, one
# short; run33 ran it with PYTHONPATH set instead, as its README shows. Not run since the fix.)
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 5)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "kernels"))
sys.path.insert(0, ROOT)
import torch
import bench_moe as B
from gptoss_spark.kernels import router_logits as RL
from gptoss_spark.kernels.moe import DEFAULT_CONFIG, fused_moe_decode
out_path = sys.argv[1]
m = int(sys.argv[2]) if len(sys.argv) > 2 else 1
NL = 4
layers = [B.Layer(seed=s) for s in range(NL)]
xs = [torch.randn(m, B.H, device="cuda").bfloat16() for _ in layers]
bufs = [[torch.zeros(1024 * 16, dtype=torch.int64, device="cuda") for _ in range(3)] for _ in layers]
def run_all():
    for li, lay in enumerate(layers):
        RL.STAMPS[:] = bufs[li]
        fused_moe_decode(xs[li], lay.rw, lay.rb, *lay.experts(), B.TOPK, DEFAULT_CONFIG)
run_all(); torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    run_all()
for _ in range(30):
    g.replay()
torch.cuda.synchronize()
# time the graph too (so we know the instrumented per-layer time)
st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
st.record()
for _ in range(200):
    g.replay()
en.record(); torch.cuda.synchronize()
print("per layer us (instrumented):", st.elapsed_time(en) / 200 / NL * 1e3)
g.replay(); torch.cuda.synchronize()
torch.save([[b.view(1024, 16).cpu() for b in lb] for lb in bufs], out_path)
print("saved", out_path)
