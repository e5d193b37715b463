"""Registers, shared memory and resident programs per SM of every kernel variant, from the compiled binaries.

    python3 benchmarks/kernels/occupancy.py --arch 12.1a [--set mma_sync_m_pad=16 ...]   # no GPU needed

Compiles the variants the AOT build would (aot.compile_variants, gpt-oss-120b)
and the prefill kernels (aot.compile_prefill_variants),
reads each binary's registers (cuobjdump -res-usage, shipped with Triton) and
shared memory (Triton's metadata), and works out how many programs of 4 warps
one SM holds under that arch's limits, and which limit binds. The limits are
CUDA's per-arch figures: sm_90 228 KB shared memory per SM, 2048 threads, 32
blocks; sm_120/sm_121 (GB10) 100 KB, 1536 threads, 24 blocks; both 64 K
registers allocated per warp in units of 256, 1 KB of shared memory reserved
per block. This is arithmetic on the binaries, not a measurement on the chip.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LIMITS = {  # major: (shared memory per SM, threads per SM, blocks per SM)
    9: (228 * 1024, 2048, 32),
    12: (100 * 1024, 1536, 24),
}
REGS_PER_SM = 65536
RESERVED_SMEM = 1024
THREADS = 128  # EXPERT_WARPS x 32; the router uses 4 warps too


def registers(cubin: bytes) -> int:
    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"REG:(\d+)", out).group(1))


def programs_per_sm(regs: int, smem: int, major: int) -> tuple[int, str]:
    smem_sm, threads_sm, blocks_sm = LIMITS[major]
    per_warp = -(-regs * 32 // 256) * 256
    limits = {
        "registers": REGS_PER_SM // (per_warp * THREADS // 32),
        "shared memory": smem_sm // (smem + RESERVED_SMEM),
        "threads": threads_sm // THREADS,
        "blocks": blocks_sm,
    }
    binding = min(limits, key=limits.get)
    return limits[binding], binding


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="12.1a", help="9.0a or 12.1a")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=INT", help="MoeLaunchConfig changes")
    args = ap.parse_args()
    from triton.backends.compiler import GPUTarget

    from dataclasses import replace

    from gptoss_spark.kernel_tools.aot import _plan_name, compile_prefill_variants, compile_variants, parse_arch
    from gptoss_spark.kernels.moe import DEFAULT_CONFIG
    from gptoss_spark.kernels.mxfp4_layout import mma_layout_for_capability
    from gptoss_spark.kernel_tools.variants import GPT_OSS_120B, token_counts
    major, minor, _ = parse_arch(args.arch)
    if major not in LIMITS:
        sys.exit(f"occupancy.py: no per-SM limits for sm_{major}{minor}; known: 9.x, 12.x")
    mma = mma_layout_for_capability(major)
    cfg = replace(DEFAULT_CONFIG, **{k: int(v) for k, v in (a.split("=", 1) for a in args.set)})
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="occupancy-"))
    print(f"# sm_{major}{minor} (layout {mma}), gpt-oss-120b, {' '.join(args.set) or 'default config'}: "
          "programs of 4 warps per SM from registers and shared memory")
    print("| plan | kernel | registers | shared memory (KB) | programs per SM | bound by |")
    print("|---|---|---|---|---|---|")
    target = GPUTarget("cuda", major * 10 + minor, 32)
    builds = [(_plan_name(GPT_OSS_120B, m, mma, cfg), compile_variants(GPT_OSS_120B, m, target, cfg))
              for m in token_counts(GPT_OSS_120B, mma)]
    builds.append(("prefill (moe_prefill.py, default PrefillConfig)", compile_prefill_variants(GPT_OSS_120B, target)))
    for plan, kernels in builds:
        for name, ck in kernels:
            regs = registers(ck.asm["cubin"])
            smem = ck.metadata.shared
            n, why = programs_per_sm(regs, smem, major)
            print(f"| {plan} | {name} | {regs} | {smem / 1024:.0f} | {n} | {why} |", flush=True)


if __name__ == "__main__":
    main()
