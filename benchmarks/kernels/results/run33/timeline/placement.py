"""Per expert kernel: how many programs each SM ran, and when those SMs' programs entered and ended
their loops; then the gap from a layer's last store to the next layer's router leaving its PDL wait.
Reads run31's timeline format (a run_timeline.py .pt, or this folder's .npz). usage: python3 placement.py X.npz"""
import sys
import numpy as np

sys.path.insert(0, __file__.rsplit("/", 3)[0] + "/run31/timeline")
from analyze import load  # noqa: E402


def main(path):
    layers = load(path)
    for li in (1, 2):
        base = layers[li][0][:, 0].min()
        for name, a in (("gate_up", layers[li][1]), ("down", layers[li][2])):
            per_sm = np.bincount(a[:, 15], minlength=132)
            n = per_sm[a[:, 15]]
            rows = []
            for c in sorted(set(n.tolist())):
                on = n == c
                rows.append(f"{c}/SM on {(per_sm == c).sum()} SMs: entry {np.median(a[on, 0] - base) / 1e3:.2f}, "
                            f"loop end median {np.median(a[on, 3] - base) / 1e3:.2f} max {(a[on, 3] - base).max() / 1e3:.2f}")
            print(f"layer {li} {name:8s}", " | ".join(rows))
    for li in range(3):
        base = layers[li][0][:, 0].min()
        last_store = layers[li][2][:, 5].max()
        router_wait = np.median(layers[li + 1][0][:, 1])
        print(f"layer {li}: last store {(last_store - base) / 1e3:.2f} us, next router's wait returns "
              f"{(router_wait - last_store) / 1e3:.2f} us later")


if __name__ == "__main__":
    main(sys.argv[1])
