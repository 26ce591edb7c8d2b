"""Stability curves: each figure of a run, against offered rate, per workload x cluster x policy.

A point's figures are those of :mod:`llmlb_bench.sweep.figures` (the same
SQL as ``llmlb report``), one set per seed, combined into a mean with a 95%
interval. Per curve: the knee of the latency metric the sweep names
(default mean E2E) and DistServe's maximum goodput, the highest rate whose
mean attainment still reaches the target.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, TypeAlias, TypedDict

from llmlb_bench.metrics.goodput import GoodputPoint, highest_passing
from llmlb_bench.metrics.run_figures import MaxGoodput
from llmlb_bench.sweep.cells import Cell
from llmlb_bench.metrics.knee import kneedle
from llmlb_bench.sweep.figures import Figures
from llmlb_bench.sweep.stats import MeanCi, mean_ci

#: one point of a curve as summary.json has it: ``x``, ``rate``, ``rate_scale``, ``load``, ``seeds``,
#: ``run_ids``, then each figure's :class:`MeanCi` under its name (``ttft.p99``, ``goodput``, ...)
CurvePoint: TypeAlias = dict[str, object]


class Knee(TypedDict):
    """Where the knee metric's curve bends (Kneedle), and its value there."""

    x: float
    rate: float
    metric: str
    value: float | None


class CurveGoodput(MaxGoodput):
    """Maximum goodput of a curve, and where it is on the sweep's axis."""

    x: float


class Curve(TypedDict):
    workload: str
    cluster: str
    policy: str
    points: list[CurvePoint]
    knee: Knee | None
    max_goodput: CurveGoodput | None


@dataclass(frozen=True)
class _Point:
    """A point's coordinates and figures, typed, before they are written out as one table."""

    x: float
    rate: float
    run_ids: list[str]
    figures: dict[str, MeanCi]

    def mean(self, name: str) -> float | None:
        stat = self.figures.get(name)
        return None if stat is None else stat["mean"]


def stability_curves(cells: Iterable[Cell], figures: Mapping[str, Figures],
                     knee_metric: str, target: float = 0.9) -> list[Curve]:
    """One curve per (workload, cluster, policy), points sorted by rate, in the order cells were planned.

    ``figures`` maps each cell's run id to its figures; ``target`` is the attainment max goodput must keep.
    """
    cells = list(cells)
    curves: dict[tuple[str, str, str], dict[float, list[Cell]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        curves[(c.workload, c.cluster, c.policy)][c.x].append(c)
    out: list[Curve] = []
    for (workload, cluster, policy), by_x in curves.items():
        points: list[_Point] = []
        rows: list[CurvePoint] = []
        for x in sorted(by_x):
            group = by_x[x]
            runs = [figures[c.run_id] for c in group]
            names = sorted({k for r in runs for k in r})
            point = _Point(x, group[0].rate, [c.run_id for c in group],
                           {k: mean_ci([r.get(k) for r in runs]) for k in names})
            points.append(point)
            rows.append({
                "x": x, "rate": group[0].rate, "rate_scale": group[0].rate_scale, "load": group[0].load,
                "seeds": [c.seed for c in group], "run_ids": point.run_ids, **point.figures,
            })
        knee_x = kneedle([p.x for p in points], [p.mean(knee_metric) for p in points])
        out.append({
            "workload": workload, "cluster": cluster, "policy": policy, "points": rows,
            "knee": None if knee_x is None else _at(points, knee_x, knee_metric),
            "max_goodput": _max_goodput(points, target),
        })
    return out


def _max_goodput(points: list[_Point], target: float) -> CurveGoodput | None:
    """DistServe's maximum goodput (:func:`llmlb_bench.metrics.goodput.max_goodput`) on the seed means:
    the highest offered rate whose mean attainment reaches ``target``."""
    means: list[GoodputPoint] = [
        {"run_id": ",".join(p.run_ids), "offered_rate": p.rate, "attainment": p.mean("attainment"),
         "goodput": p.mean("goodput"), "good_token_throughput": p.mean("good_token_throughput"), "gpus": None}
        for p in points if "attainment" in p.figures]
    best = highest_passing(means, target)
    if best is None:
        return None
    return {**best, "x": next(p.x for p in points if ",".join(p.run_ids) == best["run_id"])}


def _at(points: list[_Point], x: float, metric: str) -> Knee:
    p = next(p for p in points if p.x == x)
    return {"x": x, "rate": p.rate, "metric": metric, "value": p.mean(metric)}
