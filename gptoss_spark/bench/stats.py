"""Small statistics over measured values; no numpy so a thin client venv suffices."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 100]."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe(values: Sequence[float]) -> dict:
    """n, median, mean, min, p10, p90, max of the values (None fields when empty)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"n": 0, "median": None, "mean": None, "min": None, "p10": None, "p90": None, "max": None}
    return {
        "n": len(vals),
        "median": percentile(vals, 50),
        "mean": sum(vals) / len(vals),
        "min": min(vals),
        "p10": percentile(vals, 10),
        "p90": percentile(vals, 90),
        "max": max(vals),
    }


def max_concurrency(intervals: Sequence[tuple[float, float]]) -> int:
    """Most intervals open at one instant (sweep line; an end before a start at a tie)."""
    events = [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals]
    events.sort(key=lambda e: (e[0], e[1]))
    best = cur = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return best
