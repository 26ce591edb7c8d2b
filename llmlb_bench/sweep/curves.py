"""Stability curves: each figure of a run, against offered rate, per workload x cluster x policy.

Every run is summarised by :func:`llmlb_bench.metrics.summary.summarize`
(the same SQL as ``llmlb report``), so a point on a curve is exactly the
report of its runs; the repeats of a point (one run per seed) are combined
into a mean with a 95% interval. Per curve: the knee of the latency metric
the sweep names (default mean E2E) and the highest mean goodput reached.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.store.views import Catalog
from llmlb_bench.sweep.cells import Cell
from llmlb_bench.sweep.knee import kneedle
from llmlb_bench.sweep.stats import mean_ci

LATENCY_STATS = ("mean", "p50", "p90", "p99")


def run_figures(summary: dict[str, Any]) -> dict[str, float | None]:
    """The figures a curve plots, flattened from one run's summary (``ttft.p99``, ``goodput``, ...)."""
    out: dict[str, float | None] = {"throughput": summary["request_throughput"],
                                    "output_throughput": summary["output_throughput"]}
    slo = summary.get("slo")
    if slo is not None:
        out["attainment"] = slo["attainment"]
        out["goodput"] = slo["goodput"]
        out["good_token_throughput"] = slo["good_token_throughput"]
    for name in ("ttft", "tpot", "itl", "e2e"):
        for stat in LATENCY_STATS:
            out[f"{name}.{stat}"] = (summary.get(name) or {}).get(stat)
    return out


def stability_curves(root: Path, cells: Iterable[Cell], slo: Slo | None, knee_metric: str) -> list[dict[str, Any]]:
    """One curve per (workload, cluster, policy), points sorted by rate, in the order cells were planned."""
    cells = list(cells)
    cat = Catalog([root / c.run_id for c in cells])
    # DuckDB sums floats in parallel in whatever order its threads finish, which moves the last bits of
    # means from one call to the next; one thread makes a sweep's figures repeat exactly.
    cat.con.execute("SET threads TO 1")
    figures = {s["run_id"]: run_figures(s) for s in summarize(cat, slo)}
    curves: dict[tuple[str, str, str], dict[float, list[Cell]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        curves[(c.workload, c.cluster, c.policy)][c.x].append(c)
    out = []
    for (workload, cluster, policy), by_x in curves.items():
        points = []
        for x in sorted(by_x):
            group = by_x[x]
            runs = [figures.get(c.run_id, {}) for c in group]
            names = sorted({k for r in runs for k in r})
            points.append({
                "x": x, "rate": group[0].rate, "rate_scale": group[0].rate_scale, "load": group[0].load,
                "seeds": [c.seed for c in group], "run_ids": [c.run_id for c in group],
                **{k: mean_ci([r.get(k) for r in runs]) for k in names},
            })
        knee_x = kneedle([p["x"] for p in points], [p.get(knee_metric, {}).get("mean") for p in points])
        good = [p for p in points if (p.get("goodput") or {}).get("mean") is not None]
        best = max(good, key=lambda p: p["goodput"]["mean"]) if good else None
        out.append({
            "workload": workload, "cluster": cluster, "policy": policy, "points": points,
            "knee": None if knee_x is None else _at(points, knee_x, knee_metric),
            "max_goodput": None if best is None else {"x": best["x"], "rate": best["rate"],
                                                      "goodput": best["goodput"]["mean"]},
        })
    return out


def _at(points: list[dict[str, Any]], x: float, metric: str) -> dict[str, Any]:
    p = next(p for p in points if p["x"] == x)
    return {"x": x, "rate": p["rate"], "metric": metric, "value": p[metric]["mean"]}
