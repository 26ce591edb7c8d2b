"""Confidence intervals over a sweep's repeats.

A sweep repeats each point with a handful of seeds (3-10); the mean of the
per-seed figures with a Student-t interval is the honest summary of so few
samples (a bootstrap over three values cannot be wider than their range).
Per-request bootstrap intervals of single runs belong to the metrics
package.
"""

from __future__ import annotations

import math
from typing import Sequence, TypedDict

CONFIDENCE = 0.95


class MeanCi(TypedDict):
    """A figure's mean over a sweep's repeats, its interval (None from fewer than two values) and count."""

    mean: float | None
    low: float | None
    high: float | None
    n: int


def mean_ci(values: Sequence[float | None], confidence: float = CONFIDENCE) -> MeanCi:
    """``{"mean", "low", "high", "n"}`` over the values that are not None; no interval from one value."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(xs)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "n": 0}
    mean = sum(xs) / n
    if n == 1:
        return {"mean": mean, "low": None, "high": None, "n": 1}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    from scipy import stats  # imported where used: scipy costs every CLI command ~0.5 s otherwise

    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}
