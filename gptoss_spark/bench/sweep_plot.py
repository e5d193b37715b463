"""A sweep's files beside its JSON: a CSV (one row per profile and concurrency) and a PNG of the curves.

The PNG has three panels against concurrency (log scale): aggregate tok/s,
per-user tok/s (median decode rate), TTFT p50 (solid) and p95 (dashed); one
line per profile. Drawn by matplotlib (the `bench` extra) on its Agg backend:
no display, no GUI toolkit, the same on a headless Spark.
"""

from __future__ import annotations

import csv
from pathlib import Path

from ..base.errors import UserError

CSV_FIELDS = ("profile", "concurrency", "requests", "valid_requests", "invalid_requests", "completion_tokens_total",
              "makespan_s", "aggregate_tok_s", "per_user_tok_s", "ttft_p50_s", "ttft_p95_s", "observed_concurrency")


def sibling_paths(out: Path) -> tuple[Path, Path, Path]:
    """JSON, CSV and PNG paths from --out (its suffix, if any, is replaced)."""
    stem = out.with_suffix("") if out.suffix in (".json", ".csv", ".png") else out
    return stem.with_suffix(".json"), stem.with_suffix(".csv"), stem.with_suffix(".png")


def write_csv(sweeps: dict[str, dict], path: Path) -> None:
    try:
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            for name, res in sweeps.items():
                for p in (res or {}).get("points", []):
                    w.writerow({"profile": name, **p})
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror}; pass --out with a writable path") from None


def draw_png(sweeps: dict[str, dict], path: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise UserError("drawing the sweep needs matplotlib, in the `bench` extra: "
                        "pip install 'gptoss-spark[bench]' (install.sh installs it)") from None
    matplotlib.use("Agg")  # files only: works without a display
    import matplotlib.pyplot as plt

    fig, (agg, user, ttft) = plt.subplots(1, 3, figsize=(16, 5), constrained_layout=True)
    ticks: set[int] = set()
    for i, (name, res) in enumerate(sweeps.items()):
        pts = [p for p in (res or {}).get("points", [])]
        if not pts:
            continue
        color = f"C{i % 10}"
        xs = [p["concurrency"] for p in pts]
        ticks.update(xs)

        def line(ax, key, **kw):
            ys = [p[key] for p in pts]
            ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None],
                    marker="o", color=color, **kw)

        line(agg, "aggregate_tok_s", label=name)
        line(user, "per_user_tok_s", label=name)
        line(ttft, "ttft_p50_s", label=f"{name} p50")
        line(ttft, "ttft_p95_s", linestyle="--", label=f"{name} p95")
    for ax, label in ((agg, "aggregate tok/s"), (user, "per-user tok/s (median decode)"), (ttft, "TTFT (s)")):
        ax.set_xscale("log")
        ax.set_xticks(sorted(ticks) or [1])
        ax.set_xticklabels([str(t) for t in sorted(ticks)] or ["1"])
        ax.minorticks_off()
        ax.set_xlabel("concurrent users")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(title)
    try:
        fig.savefig(path, dpi=100)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror}; pass --out with a writable path") from None
    finally:
        plt.close(fig)


def plot_title(sweeps: dict[str, dict]) -> str:
    """What was measured where, from the results' host snapshots: never 'a Spark' unless it was one."""
    any_res = next((r for r in sweeps.values() if r), {}) or {}
    host = any_res.get("host") or {}
    where = "DGX Spark" if host.get("is_dgx_spark") else "NOT a DGX Spark"
    proto = any_res.get("protocol") or {}
    return (f"gptoss-spark sweep on {host.get('hostname') or 'this host'} ({where}); {proto.get('endpoint')}, "
            f"max_tokens {proto.get('max_tokens')}, {proto.get('seconds_per_point')} s per point")
