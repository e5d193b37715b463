"""Summarize run_timeline.py's stamps: per kernel and stamp, min / median / max in us from the
router's first entry (globaltimer, 32 ns steps on the H200), per-program phase lengths (clock64
at 1.98 GHz), and how many programs each SM ran. usage: python3 analyze.py layout2.npz|OUT.pt"""
import sys
import numpy as np

NAMES = (("router", 120), ("gate_up", 360), ("down", 360))
STAMPS = {"router": "entry, after PDL wait, partials stored",
          "gate_up": "entry, after PDL wait, top-k done (loop start), loop end, h stored",
          "down": "entry, after PDL wait, routing read (loop start), loop end, partial stored + arrival, last program's sum stored"}


def load(path):
    if path.endswith(".npz"):
        z = np.load(path)
        return [[z[f"layer{li}_{n}"] for n, _ in NAMES] for li in range(4)]
    import torch
    return [[b[:n].numpy() for b, (_, n) in zip(lb, NAMES)] for lb in torch.load(path)]


def main(path):
    layers = load(path)
    for li in (1, 2):  # layers 1 and 2 follow a layer in the same graph, as in bench_moe
        base = layers[li][0][:, 0].min()
        print(f"--- layer {li}: us from the router's first entry")
        for (name, _), a in zip(NAMES, layers[li]):
            used = [j for j in range(8) if (a[:, j] != 0).any()]
            # A stamp counts if it follows the program's previous one: the last program's sum (down's
            # s5) is stamped only by whichever program was last, so others keep an older replay's.
            fresh = {j: (a[:, j] != 0) & ((a[:, j] >= a[:, used[k - 1]]) if k else True) for k, j in enumerate(used)}
            print(f"{name:8s} ({STAMPS[name]})")
            print("   ", " | ".join(f"s{j} {np.min((a[fresh[j], j] - base) / 1e3):6.2f} "
                                      f"{np.median((a[fresh[j], j] - base) / 1e3):6.2f} "
                                      f"{np.max((a[fresh[j], j] - base) / 1e3):6.2f}" for j in used))
            phases = []
            for j0, j1 in zip(used, used[1:]):
                ok = fresh[j0] & fresh[j1]
                d = (a[ok, 8 + j1] - a[ok, 8 + j0]) / 1980.0
                phases.append(f"s{j0}->s{j1} median {np.median(d):5.2f} max {d.max():5.2f}")
            print("   ", " | ".join(phases))
            per_sm = np.bincount(np.bincount(a[:, 15], minlength=132))
            print("    SMs running 0, 1, 2, ... programs:", per_sm.tolist())


if __name__ == "__main__":
    main(sys.argv[1])
