"""Capacity search: the highest request rate at which a policy still meets an SLO attainment target.

For one seed, attainment falls as the rate rises: the trace at a higher
rate scale is the same requests arriving proportionally sooner (every
arrival process draws its gaps from the same random stream whatever the
scale), so the comparison between two rates is not blurred by two different
samples. The search brackets the target between ``low`` and ``high`` and
bisects geometrically (rates span orders of magnitude, and a relative
tolerance is what matters) until ``high / low <= 1 + tolerance``. The
answer is ``low``: the highest rate *observed* to meet the target.

Each evaluation is an ordinary cell (stored, tagged ``phase = capacity``),
so a rerun replays the same bisection from stored runs without simulating
again. Repeats give one capacity per seed; their mean and Student-t
interval are the figure to report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmlb_bench.sweep.cells import Cell, execute
from llmlb_bench.sweep.stats import mean_ci


@dataclass(frozen=True)
class CapacityTask:
    """One bisection: a cell template (its rate is filled in per step) and the search's settings."""

    template: Cell
    nominal_rate: float
    slo: str
    target: float
    low: float
    high: float
    tolerance: float

    def cell(self, rate: float) -> Cell:
        return replace(self.template, axis="rate", x=rate, rate=rate, rate_scale=rate / self.nominal_rate)


def search(task: CapacityTask, root: str | Path) -> dict[str, Any]:
    """Bisect one seed's capacity; the worker's entry point.

    Returns the capacity (None when even ``low`` misses the target), the
    bracket it ended in, whether it is censored at ``high``, and every
    evaluation (rate, attainment, run id, whether it was simulated now) in the order made.
    """
    evaluations: list[dict[str, Any]] = []

    def meets(rate: float) -> bool:
        result = execute(task.cell(rate), root, task.slo)
        a = result["figures"]["attainment"]
        evaluations.append({"rate": rate, "attainment": a, "run_id": result["run_id"], "ran": result["ran"]})
        return a >= task.target

    lo, hi = task.low, task.high
    out = {"seed": task.template.seed, "evaluations": evaluations}
    if not meets(lo):
        return {**out, "capacity": None, "bracket": [0.0, lo], "censored": "below"}
    if meets(hi):
        return {**out, "capacity": hi, "bracket": [hi, math.inf], "censored": "above"}
    while hi / lo > 1.0 + task.tolerance:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return {**out, "capacity": lo, "bracket": [lo, hi], "censored": None}


def combine(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean capacity over seeds with its 95% interval; censored seeds are flagged, not hidden.

    A seed below the bracket counts as capacity 0 (the policy met the target
    at no rate tried); one above it counts as ``high``, so the mean is then a
    lower bound.
    """
    values = [0.0 if r["capacity"] is None else r["capacity"] for r in per_seed]
    censored = sorted({r["censored"] for r in per_seed if r["censored"]})
    return {**mean_ci(values), "censored": censored, "per_seed": per_seed}
