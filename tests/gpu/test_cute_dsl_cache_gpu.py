"""FlashInfer's CuTe-DSL MXFP8 quantizer compiled once, then served from disk (device runs only).

Three engine-like processes quantize the same bf16 activations with
flashinfer.quantization.kernels.mxfp8_quantize.mxfp8_quantize_cute_dsl, both scale layouts:
1. the cache on, empty: each builder compiles and is stored (gptoss_spark/engine_hooks/cute_dsl_cache.py);
2. the cache on, same directory: each builder is loaded, `cute.compile` is never called;
3. the cache off: FlashInfer's own path, the reference.
All three must give the same bytes. Needs flashinfer-python, nvidia-cutlass-dsl and apache-tvm-ffi.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(r"""
    import hashlib, json, logging, sys, time, torch
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    from gptoss_spark.engine_hooks import cute_dsl_cache
    cute_dsl_cache.install()
    import cutlass.cute as cute
    calls = []
    real = cute.compile
    class Counting:  # counts compiles the way vLLM's jit_monitor wraps cute.compile
        def __getitem__(self, o): return real[o]
        def __call__(self, *a, **k):
            calls.append(getattr(a[0], "__class__", type(a[0])).__name__)
            return real(*a, **k)
    cute.compile = Counting()
    from flashinfer.quantization.kernels.mxfp8_quantize import mxfp8_quantize_cute_dsl
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(37, 2880, device="cuda", generator=g) * 3).bfloat16()
    out = {}
    t0 = time.perf_counter()
    for swizzled in (True, False):
        q, s = mxfp8_quantize_cute_dsl(x, is_sf_swizzled_layout=swizzled)
        torch.cuda.synchronize()
        data = q.view(torch.uint8).cpu().numpy().tobytes() + s.view(torch.uint8).cpu().numpy().tobytes()
        out[str(swizzled)] = hashlib.sha256(data).hexdigest()
    print("RESULT " + json.dumps({"out": out, "compiles": calls, "seconds": time.perf_counter() - t0}))
""")


def run(cache: Path | None) -> tuple[dict, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("GPTOSS_SPARK_CUTE_DSL_CACHE", None)
    if cache is not None:
        env["GPTOSS_SPARK_CUTE_DSL_CACHE"] = str(cache)
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), p.stdout


def test_second_start_loads_the_quantizer_from_disk(tmp_path):
    cache = tmp_path / "cute-dsl"
    first, log1 = run(cache)
    assert len(first["compiles"]) == 2, first  # swizzled and linear builders
    assert log1.count("gptoss-spark cute-dsl compiled:") == 2, log1
    assert len(list(cache.glob("*.o"))) == 2
    second, log2 = run(cache)
    assert second["compiles"] == [], second  # nothing compiled: both loaded
    assert log2.count("gptoss-spark cute-dsl cache hit:") == 2, log2
    reference, _ = run(None)
    assert first["out"] == second["out"] == reference["out"]
    record = {"first_start_s": round(first["seconds"], 2), "second_start_s": round(second["seconds"], 2),
              "reference_s": round(reference["seconds"], 2), "device": torch.cuda.get_device_name(),
              "capability": ".".join(map(str, torch.cuda.get_device_capability()))}
    print("CUTE_DSL_CACHE " + json.dumps(record))
    out = os.environ.get("OUT")
    if out:
        Path(out, "cute_dsl_cache.json").write_text(json.dumps(record, indent=1))
