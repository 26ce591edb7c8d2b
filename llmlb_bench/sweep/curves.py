"""Stability curves: each figure of a run, against offered rate, per workload x cluster x policy.

A point's figures are those of :mod:`llmlb_bench.sweep.figures` (the same
SQL as ``llmlb report``), one set per seed, combined into a mean with a 95%
interval. Per curve: the knee of the latency metric the sweep names
(default mean E2E) and DistServe's maximum goodput, the highest rate whose
mean attainment still reaches the target.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping

from llmlb_bench.metrics.goodput import max_goodput
from llmlb_bench.sweep.cells import Cell
from llmlb_bench.metrics.knee import kneedle
from llmlb_bench.sweep.stats import mean_ci


def stability_curves(cells: Iterable[Cell], figures: Mapping[str, Mapping[str, Any]],
                     knee_metric: str, target: float = 0.9) -> list[dict[str, Any]]:
    """One curve per (workload, cluster, policy), points sorted by rate, in the order cells were planned.

    ``figures`` maps each cell's run id to its figures; ``target`` is the attainment max goodput must keep.
    """
    cells = list(cells)
    curves: dict[tuple[str, str, str], dict[float, list[Cell]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        curves[(c.workload, c.cluster, c.policy)][c.x].append(c)
    out = []
    for (workload, cluster, policy), by_x in curves.items():
        points: list[dict[str, Any]] = []
        for x in sorted(by_x):
            group = by_x[x]
            runs = [figures[c.run_id] for c in group]
            names = sorted({k for r in runs for k in r})
            points.append({
                "x": x, "rate": group[0].rate, "rate_scale": group[0].rate_scale, "load": group[0].load,
                "seeds": [c.seed for c in group], "run_ids": [c.run_id for c in group],
                **{k: mean_ci([r.get(k) for r in runs]) for k in names},
            })
        knee_x = kneedle([p["x"] for p in points], [p.get(knee_metric, {}).get("mean") for p in points])
        out.append({
            "workload": workload, "cluster": cluster, "policy": policy, "points": points,
            "knee": None if knee_x is None else _at(points, knee_x, knee_metric),
            "max_goodput": _max_goodput(points, target),
        })
    return out


def _max_goodput(points: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """DistServe's maximum goodput (:func:`llmlb_bench.metrics.goodput.max_goodput`) on the seed means:
    the highest offered rate whose mean attainment reaches ``target``."""
    means = [{"run_id": ",".join(p["run_ids"]), "offered_rate": p["rate"], "x": p["x"],
              "slo": {k: p[k]["mean"] for k in ("attainment", "goodput", "good_token_throughput")}}
             for p in points if "attainment" in p]
    best = max_goodput(means, target)
    if best is None:
        return None
    return {**best, "x": next(m["x"] for m in means if m["run_id"] == best["run_id"])}


def _at(points: list[dict[str, Any]], x: float, metric: str) -> dict[str, Any]:
    p = next(p for p in points if p["x"] == x)
    return {"x": x, "rate": p["rate"], "metric": metric, "value": p[metric]["mean"]}
