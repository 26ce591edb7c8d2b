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

The bisection itself (:func:`bisect`) only asks a ``meets(rate)`` probe, so
the same search runs on the simulator (:func:`search`) and against real
endpoints (:mod:`llmlb_bench.sweep.endpoint_capacity`), where a probe may
refuse to start because it would not fit in what is left of a budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence, TypedDict

from llmlb_bench.sweep.cells import Cell, execute
from llmlb_bench.sweep.stats import MeanCi, mean_ci


class Outcome(TypedDict):
    """One search's capacity (None: no rate met the target) and why it is censored (see :func:`bisect`)."""

    capacity: float | None
    censored: str | None


class Bisection(Outcome):
    """:func:`bisect`'s answer: the capacity, the bracket around it and why it is censored."""

    bracket: list[float]


class Evaluation(TypedDict):
    """One rate a simulated search tried."""

    rate: float
    attainment: float
    run_id: str
    ran: bool


class SeedCapacity(Bisection):
    """One seed's simulated search (:func:`search`): its bisection and every evaluation, in order."""

    seed: int
    evaluations: list[Evaluation]


class CapacitySummary(MeanCi):
    """The capacity over seeds (:func:`combine`): mean and interval, censored reasons, every seed's search."""

    censored: list[str]
    per_seed: Sequence[Outcome]


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


class OutOfBudget(Exception):
    """Raised by a probe that would not fit in what is left of the search's budget; the search stops there."""


def bisect(meets: Callable[[float], bool], low: float, high: float, tolerance: float,
           high_last: bool = False) -> Bisection:
    """Geometric bisection for the highest rate at which ``meets`` holds, assuming it fails from some rate on.

    Evaluates ``low``, then ``high``, then geometric midpoints until
    ``high / low <= 1 + tolerance``. With ``high_last`` the top of the bracket
    is taken to miss until every midpoint has met, and is evaluated only
    then: the same answer (when ``meets`` is monotone) without the most
    overloaded evaluation, which on a real endpoint is the slowest and
    leaves the longest queue. Returns the capacity (the highest rate
    observed to meet, None when none did), the bracket ``[highest rate that
    met or 0, lowest rate that missed or inf]``, and why it is censored:
    ``below`` (even ``low`` misses), ``above`` (``high`` meets), ``budget``
    (``meets`` raised :class:`OutOfBudget` first) or None.
    """
    met: float | None = None
    missed: float | None = None

    def probe(rate: float) -> bool:
        nonlocal met, missed
        ok = meets(rate)
        if ok:
            met = rate
        else:
            missed = rate
        return ok

    def outcome(censored: str | None) -> Bisection:
        return {"capacity": met, "bracket": [0.0 if met is None else met, math.inf if missed is None else missed],
                "censored": censored}

    try:
        if not probe(low):
            return outcome("below")
        if not high_last and probe(high):
            return outcome("above")
        lo, hi = low, high
        while hi / lo > 1.0 + tolerance:
            mid = math.sqrt(lo * hi)
            if probe(mid):
                lo = mid
            else:
                hi = mid
        if high_last and missed is None and probe(high):   # every midpoint met: does the top too?
            return outcome("above")
    except OutOfBudget:
        return outcome("budget")
    return outcome(None)


def search(task: CapacityTask, root: str | Path) -> SeedCapacity:
    """Bisect one seed's capacity on the simulator; the worker's entry point.

    Returns :func:`bisect`'s outcome with the seed and every evaluation
    (rate, attainment, run id, whether it was simulated now) in the order made.
    """
    evaluations: list[Evaluation] = []

    def meets(rate: float) -> bool:
        result = execute(task.cell(rate), root, task.slo)
        a = result["figures"]["attainment"]
        assert a is not None, result   # a capacity search has an SLO, so every run has an attainment
        evaluations.append({"rate": rate, "attainment": a, "run_id": result["run_id"], "ran": result["ran"]})
        met: bool = a >= task.target
        return met

    return {"seed": task.template.seed, "evaluations": evaluations,
            **bisect(meets, task.low, task.high, task.tolerance)}


def combine(per_seed: Sequence[Outcome]) -> CapacitySummary:
    """Mean capacity over seeds with its 95% interval; censored seeds are flagged, not hidden.

    A seed below the bracket counts as capacity 0 (the policy met the target
    at no rate tried); one above it counts as ``high``, so the mean is then a
    lower bound.
    """
    values = [0.0 if r["capacity"] is None else r["capacity"] for r in per_seed]
    censored = sorted({r["censored"] for r in per_seed if r["censored"]})
    return {**mean_ci(values), "censored": censored, "per_seed": per_seed}
