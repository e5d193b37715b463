"""Where the warps of each kernel wait, from Nsight Compute's per-instruction stall sampling.

On the device (one layer at M tokens, warm caches as in a CUDA-graph replay):
    ncu --clock-control none --cache-control none \\
        --kernel-name regex:'router_logits_kernel|moe_gate_up_kernel|moe_down_kernel' \\
        --launch-skip 6 --launch-count 3 --section SourceCounters --section WarpStateStats \\
        --section SpeedOfLight --import-source no -o src python3 benchmarks/kernels/profile_layer.py --tokens 1
    ncu --import src.ncu-rep --page source --csv --print-source sass > src_sass.csv
Here:
    python3 benchmarks/kernels/ncu_source_summary.py src_sass.csv[.gz]

Prints, per kernel, the share of stall samples before the first K loop (the
prologue: routing loads, pipeline fill), inside the K loops, and after them
(tails, epilogue, last-to-arrive), then the instructions that collect the most.
"""

from __future__ import annotations

import csv
import gzip
import re
import sys
from collections import Counter, defaultdict

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_kernels(path: str) -> dict[str, list[dict[str, str]]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    kernels: dict[str, list[dict[str, str]]] = defaultdict(list)
    name, header = None, None
    for r in rows:
        if len(r) >= 2 and r[0] == "Kernel Name":
            name, header = r[1], None
        elif r and r[0] == "Address":
            header = r
        elif header and name and len(r) == len(header):
            kernels[name].append(dict(zip(header, r)))
    return kernels


def summarize(name: str, ins: list[dict[str, str]], top: int = 8) -> list[str]:
    base = int(ins[0]["Address"], 16)
    addr = [int(i["Address"], 16) - base for i in ins]
    samples = [float(i[SAMPLES] or 0) for i in ins]
    total = sum(samples) or 1.0
    loops = []  # (start, end) of every backward branch that spans an MMA: the K loops
    for a, i in zip(addr, ins):
        m = re.search(r"BRA (0x[0-9a-f]+)", i["Source"])
        if m and int(m.group(1), 16) - base < a:
            lo = int(m.group(1), 16) - base
            body = [j["Source"] for b, j in zip(addr, ins) if lo <= b <= a]
            if any("MMA" in s for s in body):
                loops.append((lo, a))
    inner = [(lo, hi) for lo, hi in loops if not any(lo < l2 and h2 < hi for l2, h2 in loops)]
    first = min((lo for lo, _ in inner), default=0)
    last = max((hi for _, hi in inner), default=0)
    region = Counter()
    for a, s in zip(addr, samples):
        if any(lo <= a <= hi for lo, hi in inner):
            region["K loops"] += s
        elif a < first:
            region["before the K loops"] += s
        elif a > last:
            region["after the K loops"] += s
        else:
            region["between K loops (tails, next share's fill)"] += s
    out = [f"{name}: {int(total)} samples, {len(inner)} K loop(s)"]
    out += [f"  {k}: {v / total:.0%}" for k, v in region.most_common()]
    stall_cols = [c for c in ins[0] if c.startswith("stall_") and "Not Issued" not in c]
    for a, i, s in sorted(zip(addr, ins, samples), key=lambda t: -t[2])[:top]:
        why = max(stall_cols, key=lambda c: float(i[c] or 0))
        out.append(f"  {a:#7x} {s / total:5.1%}  {i['Source'].strip()[:56]:56}  mostly {why[6:]}")
    return out


def main() -> None:
    for name, ins in read_kernels(sys.argv[1]).items():
        print("\n".join(summarize(name, ins)))


if __name__ == "__main__":
    main()
