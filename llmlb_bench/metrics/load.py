"""Stability over load: latency and throughput against offered rate, the knee, maximum goodput.

Runs of one configuration at several offered rates form a curve. A
configuration is every facet of a run's identity but its load
(:mod:`llmlb_bench.metrics.identity`: backend, policy, cluster, workload,
time scale, seed), so only runs that differ in load alone are joined. Each point
carries the run's figures with their bootstrap intervals, so a plot can
draw confidence bands. Per curve:

* knee: the offered rate past which mean E2E latency climbs steeply,
  found by Kneedle (:func:`llmlb_bench.metrics.knee.kneedle`: scale both axes
  to [0, 1] and take the point furthest below the diagonal; exact on a
  hockey stick). It depends on the range swept, so compare knees of curves
  swept over the same rates;
* capacity: :func:`llmlb_bench.metrics.goodput.max_goodput` (DistServe's maximum goodput: the highest
  offered rate whose attainment reaches the target).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Literal

from llmlb_bench.metrics.distribution import PERCENTILE_KEYS
from llmlb_bench.metrics.goodput import max_goodput
from llmlb_bench.metrics.identity import LOAD, distinct, without_load
from llmlb_bench.metrics.knee import kneedle
from llmlb_bench.metrics.run_figures import CurvePoint, LoadCurve, Percentiles, PointFigure, PointLatency, RunFigures

KNEE_FIGURE: tuple[PointLatency, Literal["mean", "p50", "p90", "p99"]] = ("e2e", "mean")


def configuration(summary: RunFigures) -> str:
    """The key of the curve a run belongs to: every facet of its identity but the load
    (:func:`llmlb_bench.metrics.identity.without_load`), so a curve joins runs that differ in load alone."""
    return without_load(summary["facets"])


def _point(s: RunFigures, rate: float) -> CurvePoint:
    slo = s["slo"]
    return {
        "run_id": s["run_id"], "rate": rate, "realised_rate": s["realised_rate"],
        "throughput": s["request_throughput"], "output_throughput": s["output_throughput"],
        "goodput": slo["goodput"] if slo else None, "attainment": slo["attainment"] if slo else None,
        "ttft": _latency(s, "ttft"), "tpot": _latency(s, "tpot"), "itl": _latency(s, "itl"), "e2e": _latency(s, "e2e"),
    }


def _latency(s: RunFigures, name: PointLatency) -> PointFigure:
    """A latency figure of the run as a point carries it: every statistic and interval but the count."""
    d = s[name]
    values: Percentiles = {}
    for k in PERCENTILE_KEYS.values():
        if k in d:
            values[k] = d[k]
    out: PointFigure = {"mean": d["mean"], **values, "ci": d["ci"]}
    if "cdf" in d:
        out["cdf"] = d["cdf"]
    return out


def load_curves(summaries: Iterable[RunFigures], target: float = 0.9) -> list[LoadCurve]:
    """Curves with at least two offered rates, in the order their first run appears.

    Each summary carries its ``facets`` (:func:`llmlb_bench.metrics.identity.facets`).
    Each curve is ``{name, points (by rate), knee_rate, max_goodput}``; its
    name lists the facets (but the load) that set it apart from the other runs.
    """
    summaries = list(summaries)
    groups: dict[str, list[tuple[float, RunFigures]]] = defaultdict(list)     # (offered rate, run)
    for s in summaries:
        if s["offered_rate"] is not None:
            groups[configuration(s)].append((s["offered_rate"], s))
    shown = [f for f in distinct(s["facets"] for s in summaries) if f != LOAD]
    curves: list[LoadCurve] = []
    for runs in groups.values():
        if len({rate for rate, _ in runs}) < 2:
            continue
        points = sorted((_point(s, rate) for rate, s in runs), key=lambda p: p["rate"])
        fig, stat = KNEE_FIGURE
        first = runs[0][1]
        f = first["facets"]
        curves.append({
            "name": " · ".join(str(f.get(k)) for k in shown) or str(f.get("policy") or first["label"]),
            "points": points,
            "knee_figure": f"{fig}.{stat}",
            "knee_rate": kneedle([p["rate"] for p in points], [p[fig].get(stat) for p in points]),
            "max_goodput": max_goodput([s for _, s in runs], target),
        })
    return curves
