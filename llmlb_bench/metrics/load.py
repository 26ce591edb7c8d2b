"""Stability over load: latency and throughput against offered rate, the knee, maximum goodput.

Runs of one configuration at several offered rates form a curve. A
configuration is the sweep's (workload, cluster, policy) when run.json
records ``config.sweep``, else (backend, policy or label). Each point
carries the run's figures with their bootstrap intervals, so a plot can
draw confidence bands. Per curve:

* knee: the offered rate past which mean E2E latency climbs steeply,
  found by Kneedle (:func:`llmlb_bench.metrics.knee.kneedle`: scale both axes
  to [0, 1] and take the point furthest below the diagonal; exact on a
  hockey stick). It depends on the range swept, so compare knees of curves
  swept over the same rates;
* max goodput: :func:`llmlb_bench.metrics.goodput.max_goodput` (DistServe).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping

from llmlb_bench.metrics.goodput import max_goodput
from llmlb_bench.metrics.knee import kneedle

KNEE_FIGURE = ("e2e", "mean")
#: Latency figures carried on each point (with their intervals).
POINT_LATENCIES = ("ttft", "tpot", "itl", "e2e")


def configuration(summary: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    """The name of the curve a run belongs to."""
    sweep = (meta.get("config") or {}).get("sweep")
    if isinstance(sweep, Mapping) and sweep.get("policy"):
        return " / ".join(str(sweep[k]) for k in ("workload", "cluster", "policy") if sweep.get(k))
    return " / ".join(str(x) for x in (summary.get("backend"), summary.get("policy") or summary.get("label")) if x)


def _point(s: Mapping[str, Any]) -> dict[str, Any]:
    slo = s.get("slo") or {}
    return {
        "run_id": s["run_id"], "rate": s["offered_rate"],
        "throughput": s["request_throughput"], "output_throughput": s["output_throughput"],
        "goodput": slo.get("goodput"), "attainment": slo.get("attainment"),
        **{name: {k: v for k, v in (s.get(name) or {}).items() if k != "n"} for name in POINT_LATENCIES},
    }


def load_curves(summaries: Iterable[Mapping[str, Any]], metas: Mapping[str, Mapping[str, Any]],
                target: float = 0.9) -> list[dict[str, Any]]:
    """Curves with at least two offered rates, in the order their first run appears.

    ``metas`` maps run ids to their run.json documents. Each curve is
    ``{name, points (by rate), knee_rate, max_goodput}``.
    """
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for s in summaries:
        if s.get("offered_rate") is not None:
            groups[configuration(s, metas.get(s["run_id"]) or {})].append(s)
    curves = []
    for name, runs in groups.items():
        if len({s["offered_rate"] for s in runs}) < 2:
            continue
        points = sorted((_point(s) for s in runs), key=lambda p: p["rate"])
        fig, stat = KNEE_FIGURE
        curves.append({
            "name": name,
            "points": points,
            "knee_figure": f"{fig}.{stat}",
            "knee_rate": kneedle([p["rate"] for p in points], [p[fig].get(stat) for p in points]),
            "max_goodput": max_goodput(runs, target),
        })
    return curves
