"""Hash of each AOT variant's SASS (instructions only, no addresses or line info): python3 sass_hashes.py CAP."""
import sys, hashlib, os, re, subprocess, tempfile, triton
CUOBJ = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
def sass_hash(cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin); f.flush()
        out = subprocess.run([CUOBJ, "-sass", f.name], capture_output=True, text=True).stdout
    ins = [re.sub(r"/\*[0-9a-f]+\*/|/\* 0x[0-9a-f]+ \*/", "", l).strip() for l in out.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", l)]
    return hashlib.sha256("\n".join(ins).encode()).hexdigest()[:16] + f" n={len(ins)}"
from pathlib import Path
sys.path.insert(0, os.environ.get("ROOT", str(Path(__file__).resolve().parents[4])))
from triton.backends.compiler import GPUTarget
from gptoss_spark.kernels.aot import compile_variants, compile_prefill_variants
from gptoss_spark.kernels.variants import GPT_OSS_120B, GPT_OSS_20B
cap = int(sys.argv[1])
t = GPUTarget("cuda", cap, 32)
for shape in (GPT_OSS_120B, GPT_OSS_20B):
    for m in (1, 2, 3, 5, 9, 17):
        for name, ck in compile_variants(shape, m, t):
            print(shape.name, m, name, sass_hash(ck.asm["cubin"]))
    for name, ck in compile_prefill_variants(shape, t):
        print(shape.name, "prefill", name, sass_hash(ck.asm["cubin"]))
