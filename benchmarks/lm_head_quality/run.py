"""lm_head quality under MXFP4: bf16 logits vs quantize -> dequantize logits, in torch.

Marlin cannot run here (no CUDA build of vLLM in reach), and need not: it multiplies the
dequantized weight (e2m1 x 2**(s-127) is exact in bf16), so the weight-side error is
all in quantize -> dequantize. The only other difference on a GPU is Marlin's bf16
accumulation order, which is not measured here.

Weights: a random bf16 matrix of the real shape (201,088 x 2,880; gpt-oss's actual
lm_head cannot be downloaded here): Gaussian (std 0.02), and Student-t with 3 degrees
of freedom x 0.02, a stress case whose largest weights are hundreds of times its
scale, so outliers set block scales. Hidden states: "random" (unit Gaussian, as after
the final RMSNorm; the logits have no dominant token, a pessimistic case for top-1)
and "confident" (a token's own weight row, scaled to 0.15 of a unit hidden state's
norm, plus unit Gaussian noise: that token leads by a few logits, as in most real
greedy decoding steps).

    python benchmarks/lm_head_quality/run.py [--rows 201088] [--tokens 256] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gptoss_spark.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402


def logits(h: torch.Tensor, w: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    out = torch.empty(h.shape[0], w.shape[0], dtype=torch.float32, device=h.device)
    for i in range(0, w.shape[0], chunk):
        out[:, i:i + chunk] = h @ w[i:i + chunk].float().T
    return out


def compare(ref: torch.Tensor, test: torch.Tensor) -> dict:
    d = (test - ref).abs()
    top1_ref, top1_test = ref.argmax(-1), test.argmax(-1)
    top5 = ref.topk(5, dim=-1).indices
    margin = ref.topk(2, dim=-1).values
    return {
        "top1_agreement": float((top1_ref == top1_test).float().mean()),
        "top1_in_ref_top5": float((top5 == top1_test.unsqueeze(-1)).any(-1).float().mean()),
        "max_abs_delta_logit": float(d.max()),
        "mean_abs_delta_logit": float(d.mean()),
        "logit_std": float(ref.std()),
        "median_top1_top2_margin": float((margin[:, 0] - margin[:, 1]).median()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=201088)
    ap.add_argument("--cols", type=int, default=2880)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 logits on both sides
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"{platform.machine()} CPU"
    results = {"shape": [a.rows, a.cols], "tokens": a.tokens, "seed": a.seed, "torch": torch.__version__,
               "device": f"{where} (not a Spark)", "cases": {}}
    for wname in ("gaussian", "student_t3"):
        if wname == "gaussian":
            w = (torch.randn(a.rows, a.cols, device=dev) * 0.02).to(torch.bfloat16)
        else:
            t3 = torch.distributions.StudentT(torch.tensor(3.0, device=dev))
            w = (t3.sample((a.rows, a.cols)) * 0.02).to(torch.bfloat16)
        t0 = time.perf_counter()
        q, s = quantize_mxfp4(w)
        t_quant = time.perf_counter() - t0
        if dev.type != "cpu":  # the same bytes as on the CPU (bit tricks behave the same on the device)
            qc, sc = quantize_mxfp4(w[:4096].cpu())
            assert torch.equal(qc, q[:4096].cpu()) and torch.equal(sc, s[:4096].cpu()), "device and CPU quantization differ"
        wq = dequantize_mxfp4(q, s, torch.bfloat16)
        assert torch.equal(wq.float(), dequantize_mxfp4(q, s, torch.float32)), "e2m1 x 2^k must be exact in bf16"
        rel_w = float((wq.float() - w.float()).norm() / w.float().norm())
        g = torch.Generator().manual_seed(a.seed + 1)  # hidden states drawn on the CPU: same on any device
        hidden = {
            "random": torch.randn(a.tokens, a.cols, generator=g).to(dev),
        }
        rows = torch.randint(0, a.rows, (a.tokens,), generator=g).to(dev)
        wr = w[rows].float()
        hidden["confident"] = wr / wr.norm(dim=-1, keepdim=True) * (a.cols ** 0.5) * 0.15 + \
            torch.randn(a.tokens, a.cols, generator=g).to(dev)
        for hname, h in hidden.items():
            h = h.to(torch.bfloat16).float()  # activations arrive in bf16
            ref, test = logits(h, w), logits(h, wq)
            r = compare(ref, test)
            r.update(weight_rel_error=rel_w, quantize_seconds=round(t_quant, 1))
            results["cases"][f"{wname}/{hname}"] = r
            print(f"{wname:10s} {hname:9s} top1 {r['top1_agreement']:.4f}  top1-in-top5 {r['top1_in_ref_top5']:.4f}  "
                  f"max|dlogit| {r['max_abs_delta_logit']:.4f}  mean|dlogit| {r['mean_abs_delta_logit']:.4f}  "
                  f"logit std {r['logit_std']:.3f}  median margin {r['median_top1_top2_margin']:.3f}  "
                  f"weight rel err {rel_w:.4f}", flush=True)
        del w, q, s, wq
    a.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
