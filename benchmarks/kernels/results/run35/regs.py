"""Compile down (and gate_up) for M tokens on this GPU's arch; print registers, spills, wgmma serialization."""
import os, sys, re, subprocess
root = sys.argv[1]
sys.path.insert(0, os.path.abspath(root))
from triton.backends.compiler import GPUTarget
from gptoss_spark.kernels import aot
from gptoss_spark.kernels.variants import MODEL_SHAPES
import triton
cuobj = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
for m in [int(a) for a in sys.argv[2:]]:
    from gptoss_spark.kernels.moe import DEFAULT_CONFIG
    from dataclasses import replace
    cfg = replace(DEFAULT_CONFIG, down_maxnreg=int(os.environ["MAXNREG"])) if os.environ.get("MAXNREG") else None
    jobs, ints = aot.variant_jobs(MODEL_SHAPES[0], m, 9, cfg)
    out = aot._compile_jobs(jobs, ints, GPUTarget("cuda", 90, 32))
    for name, ck in out:
        if "down" not in name:
            continue
        open("/tmp/k.cubin", "wb").write(ck.asm["cubin"])
        sass = subprocess.run([cuobj, "-sass", "/tmp/k.cubin"], capture_output=True, text=True).stdout
        ser = len(re.findall(r"WARPGROUP.DEPBAR.LE gsb0, 0x0", sass))
        print(root, os.environ.get("MAXNREG", ""), os.environ.get("DISABLE_MMA_V3", ""), "M", m, name, "regs", re.search(r"REG:(\d+)", subprocess.run([cuobj, "-res-usage", "/tmp/k.cubin"], capture_output=True, text=True).stdout).group(1), "depbar0", ser,
              "atom", len(re.findall("ATOMG", sass)), "stl", len(re.findall(r"\bSTL", sass)), "lines", sass.count("\n"), flush=True)
