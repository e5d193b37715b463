"""A sweep's files beside its JSON: a CSV (one row per profile and concurrency) and a PNG of the curves.

The PNG has three panels against concurrency (log scale): aggregate tok/s,
per-user tok/s (median decode rate), TTFT p50 (solid) and p95 (dashed); one
line per profile. A point with invalid requests is drawn as a hollow red-edged
"x" off the line (its figures are not measurements), and a profile whose every
request was invalid says so in its legend entry and across the figure. Drawn by matplotlib (the `bench` extra) on its Agg backend:
no display, no GUI toolkit, the same on a headless Spark.
"""

from __future__ import annotations

import csv
from pathlib import Path

from ..base.errors import UserError
from .sweep import point_validity, sweep_warning

CSV_FIELDS = ("profile", "concurrency", "requests", "valid_requests", "invalid_requests", "completion_tokens_total",
              "makespan_s", "aggregate_tok_s", "per_user_tok_s", "ttft_p50_s", "ttft_p95_s", "observed_concurrency", "validity")


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
                    w.writerow({"profile": name, **p, "validity": point_validity(p)})
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
    for i, (name, series) in enumerate(plot_series(sweeps).items()):
        color = f"C{i % 10}"
        ticks.update(series["concurrencies"])
        label = name + (" (ALL INVALID)" if series["all_invalid"] else "")

        def line(ax, key, **kw):
            good = [(x, y) for x, y in series["valid"][key] if y is not None]
            bad = [(x, y) for x, y in series["invalid"][key] if y is not None]
            ax.plot([x for x, _ in good], [y for _, y in good], marker="o", color=color, **kw)
            if bad:  # off the line, so no curve is drawn through figures that are not measurements
                ax.plot([x for x, _ in bad], [y for _, y in bad], linestyle="none", marker="x", markersize=9,
                        markeredgecolor="red", color=color,
                        label=f"{kw['label']}: invalid requests" if not good else None)

        line(agg, "aggregate_tok_s", label=label)
        line(user, "per_user_tok_s", label=label)
        line(ttft, "ttft_p50_s", label=f"{label} p50")
        line(ttft, "ttft_p95_s", linestyle="--", label=f"{label} p95")
    warnings = [w for w in (sweep_warning(r) for r in sweeps.values() if r) if w]
    if any(s["invalid"]["aggregate_tok_s"] for s in plot_series(sweeps).values()):
        title += "\nred x: a point with invalid requests (not a measurement)"
    if warnings:
        fig.text(0.5, 0.5, "ALL REQUESTS INVALID:\nnot measurements", ha="center", va="center", fontsize=28,
                 color="red", alpha=0.5)
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


SERIES_KEYS = ("aggregate_tok_s", "per_user_tok_s", "ttft_p50_s", "ttft_p95_s")


def plot_series(sweeps: dict[str, dict]) -> dict[str, dict]:
    """What the PNG draws, per profile: (concurrency, value) pairs split into points whose requests were all
    valid (on the line) and points with invalid ones (marked apart), and whether every request was invalid."""
    out = {}
    for name, res in sweeps.items():
        pts = (res or {}).get("points", [])
        if not pts:
            continue
        split = {"valid": {k: [] for k in SERIES_KEYS}, "invalid": {k: [] for k in SERIES_KEYS}}
        for p in pts:
            side = "valid" if point_validity(p) == "valid" else "invalid"
            for k in SERIES_KEYS:
                split[side][k].append((p["concurrency"], p[k]))
        out[name] = {**split, "concurrencies": [p["concurrency"] for p in pts],
                     "all_invalid": sweep_warning(res) is not None}
    return out


def plot_title(sweeps: dict[str, dict]) -> str:
    """What was measured where, from the results' host snapshots: never 'a Spark' unless it was one."""
    any_res = next((r for r in sweeps.values() if r), {}) or {}
    host = any_res.get("host") or {}
    where = "DGX Spark" if host.get("is_dgx_spark") else "NOT a DGX Spark"
    proto = any_res.get("protocol") or {}
    return (f"gptoss-spark sweep on {host.get('hostname') or 'this host'} ({where}); {proto.get('endpoint')}, "
            f"max_tokens {proto.get('max_tokens')}, {proto.get('seconds_per_point')} s per point")
