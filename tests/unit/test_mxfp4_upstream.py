"""gptoss_spark.mxfp4 gives the same bytes as vLLM 0.32.0's own quantizer (downcast_to_mxfp).

The lm_head patch quantizes on the GPU with vLLM's ``mxfp4_quantize`` (its Triton
``downcast_to_mxfp`` kernel, the one the online MXFP4 linear path uses for qkv/o).
Here that kernel runs in Triton's interpreter on the CPU: its functions are read
from the installed vLLM file (not copied) and compiled with the real triton, in a
subprocess because TRITON_INTERPRET must be set before triton decorates them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
pytest.importorskip("vllm")

SCRIPT = textwrap.dedent(r"""
    import ast, importlib.util, json, os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch, triton, triton.language as tl
    from gptoss_spark.mxfp4 import quantize_mxfp4

    path = os.path.join(importlib.util.find_spec("vllm").submodule_search_locations[0],
                        "model_executor/layers/quantization/utils/mxfp4_utils.py")
    src = open(path).read()
    ns = {"torch": torch, "triton": triton, "tl": tl}
    wanted = {"permute_shape", "_compute_quant_and_scale", "_downcast_to_mxfp", "downcast_to_mxfp"}
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            body = "\n" * (start - 1) + "\n".join(src.splitlines()[start - 1:node.end_lineno])
            exec(compile(body, path, "exec"), ns)
            wanted.discard(node.name)
    assert not wanted, f"vLLM's mxfp4_utils.py no longer defines {wanted}"

    g = torch.Generator().manual_seed(0)
    cases = {
        "lm_head-like bf16": (torch.randn(48, 2880, generator=g) * 0.02).to(torch.bfloat16),
        "wide range fp16": (torch.randn(64, 256, generator=g) * torch.logspace(-4, 3, 64).unsqueeze(1)).to(torch.float16),
    }
    edge = torch.zeros(8, 256)
    edge[1, 5] = -0.0
    edge[2, :32] = 3e38                          # amax rounds past float32's range
    edge[3, :] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0] * 32) * 0.4375  # ties
    edge[4, :] = -edge[3, :]
    edge[5, :] = torch.tensor([6.0, 6.5, 7.0, 1.74, 1.76] * 51 + [0.0]) * 2.0**-20       # saturation
    edge[6, :32] = 2.0**-120
    edge[7, :] = torch.finfo(torch.bfloat16).max
    cases["edge bf16"] = edge.to(torch.bfloat16)
    out = {}
    for name, w in cases.items():
        q, s, _ = ns["downcast_to_mxfp"](w, axis=-1)
        q2, s2 = quantize_mxfp4(w)
        out[name] = {"scales_equal": bool(torch.equal(s, s2)), "values_equal": bool(torch.equal(q, q2)),
                     "first_diff": (q != q2).nonzero()[:3].tolist() + (s != s2).nonzero()[:3].tolist()}
    print(json.dumps(out))
""")


def test_bytes_equal_vllm_downcast_to_mxfp():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, r in result.items():
        assert r["scales_equal"] and r["values_equal"], f"{name}: differs from vLLM's quantizer at {r['first_diff']}"
