"""The knee of a stability curve: the load past which latency starts to climb steeply.

Kneedle (Satopaa, Albrecht, Irwin, Raghavan, "Finding a 'Kneedle' in a
Haystack", ICDCSW 2011): scale x and y to [0, 1]; for an increasing convex
curve the knee is the point furthest below the diagonal, i.e. the maximum
of ``x_n - y_n``. It needs no smoothing parameter and is exact on a hockey
stick (flat, then a straight rise from x = k gives k). For the M/M/1 mean
time in system 1 / (1 - rho) swept over rho in [a, r] it is where the slope
equals the chord's, 1 - sqrt((1 - a)(1 - r)): the geometric mean of the
two ends' spare capacity.

The knee depends on the range swept (the normalisation sees only that), so
curves are compared by knee only when swept over the same range.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def kneedle(xs: Sequence[float], ys: Sequence[float | None]) -> float | None:
    """The x of the knee of an increasing convex curve; None with < 3 points or no convex bend."""
    pairs = sorted((float(x), float(y)) for x, y in zip(xs, ys) if y is not None)
    if len(pairs) < 3:
        return None
    x = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    if not (x[-1] > x[0] and y.max() > y.min()):
        return None
    diff = (x - x[0]) / (x[-1] - x[0]) - (y - y.min()) / (y.max() - y.min())
    i = int(np.argmax(diff))
    return float(x[i]) if diff[i] > 1e-9 else None  # a straight line is 0 up to rounding
