"""Allocation-free scans over a :class:`View`, shared by the policies.

``choose`` runs up to a million times per simulated run, so these helpers
loop over plain lists and never build intermediate structures. Ties rotate
with a caller-supplied ``start`` so that idle targets are not always filled
from index 0 (which would skew every load-aware policy towards low indices).
"""

from __future__ import annotations

from typing import Sequence

from llmlb_bench.policies.base import View
from llmlb_bench.policies.books import argmin


def argmin_healthy(values: Sequence[float], view: View, start: int = 0) -> int:
    """Index of the smallest value among healthy targets; ties go to the first
    healthy index at or after ``start``. With no healthy target, ``start % n``.

    Compiled (:func:`~llmlb_bench.policies.books.argmin`, which the built-in picks share): when every
    target is healthy and ``values`` is a list or tuple (the usual case; the view's are tuples), the
    builtins ``all``, ``min`` and ``index`` do the scan in C, and it runs once per routed request."""
    return argmin(values, view.healthy, start)


def healthy_min_max(values: Sequence[float], view: View) -> tuple[float, float]:
    """Smallest and largest value over healthy targets ((0, 0) when none is healthy)."""
    lo: float = 0
    hi: float = 0
    seen = False
    for v, ok in zip(values, view.healthy):
        if ok:
            if not seen:
                lo = hi = v
                seen = True
            elif v < lo:
                lo = v
            elif v > hi:
                hi = v
    return lo, hi

