"""Summaries: percentiles over trials, and min / median / max over repetitions."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): always one of the measured values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(values: Sequence[float]) -> dict[str, float]:
    """n, min, p50, p90, p99, max, mean of one sample (e.g. the trials of a latency run)."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": min(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
        "mean": statistics.fmean(values),
    }


def over_reps(values: Sequence[float]) -> dict[str, object]:
    """min / median / max of one figure measured once per repetition."""
    finite = [v for v in values if v is not None and not math.isnan(v)]
    if not finite:
        return {"min": None, "median": None, "max": None, "reps": list(values)}
    return {
        "min": min(finite),
        "median": statistics.median(finite),
        "max": max(finite),
        "reps": list(values),
    }


def figure(per_rep: Sequence[dict[str, float]], key: str) -> dict[str, object]:
    """`over_reps` of one key of per-repetition summaries."""
    return over_reps([rep.get(key, math.nan) for rep in per_rep])
