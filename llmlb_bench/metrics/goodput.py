"""SLO attainment per group, offered load, and maximum goodput over runs at several loads.

* attainment of a group (an SLO class, a tenant) = its good requests / all
  its requests (failed requests count as not good; computed with the run's
  counts in :mod:`llmlb_bench.metrics.summary`);
* goodput at one load (vLLM ``--goodput``): good requests per second of the
  run's duration, and their output tokens per second;
* maximum goodput over a sweep (DistServe, Zhong et al., OSDI 2024): the
  highest offered rate whose attainment is at least the target (90% by
  default). Rates are taken as run; nothing is interpolated between them.
* offered rate of a run: what run.json records (``config.offered_rate``,
  or a sweep's ``config.sweep.rate``), else derived from the schedule:
  (requests - 1) / (last scheduled time - first scheduled time).
"""

from __future__ import annotations

from typing import Iterable, Mapping, TypedDict

from llmlb_bench.metrics.meta import table
from llmlb_bench.metrics.run_figures import MaxGoodput, RunFigures


def offered_rate(meta: Mapping[str, object], requests: int, first_s: float | None,
                 last_s: float | None) -> float | None:
    """Requests per second the run was offered (see the module docstring)."""
    config = table(meta, "config")
    for declared in (config.get("offered_rate"), table(config, "sweep").get("rate")):
        if isinstance(declared, (int, float)) and declared > 0:
            return float(declared)
    if requests > 1 and first_s is not None and last_s is not None and last_s > first_s:
        return (requests - 1) / (last_s - first_s)
    return None


class GoodputPoint(TypedDict):
    """One load as maximum goodput weighs it: a run's figures, or a sweep point's seed means
    (sweep/curves.py); ``attainment`` None where not judged against an SLO."""

    run_id: str
    offered_rate: float | None
    attainment: float | None
    goodput: float | None
    good_token_throughput: float | None
    gpus: int | None


def max_goodput(summaries: Iterable[RunFigures], target: float = 0.9) -> MaxGoodput | None:
    """The run with the highest offered rate whose SLO attainment >= ``target`` (DistServe).

    ``summaries`` are run summaries of one configuration at several loads
    (from :func:`llmlb_bench.metrics.summary.summarize` with an SLO). Returns
    ``{rate, attainment, goodput, good_token_throughput, run_id, gpus,
    rate_per_gpu}`` or None when no run meets the target.
    """
    return highest_passing([_point(s) for s in summaries], target)


def _point(s: RunFigures) -> GoodputPoint:
    slo, energy = s["slo"], s["energy"]
    return {"run_id": s["run_id"], "offered_rate": s["offered_rate"],
            "attainment": slo["attainment"] if slo else None, "goodput": slo["goodput"] if slo else None,
            "good_token_throughput": slo["good_token_throughput"] if slo else None,
            "gpus": energy["gpus"] if energy else None}


def highest_passing(points: Iterable[GoodputPoint], target: float = 0.9) -> MaxGoodput | None:
    """:func:`max_goodput` over loads given as points: the first of the highest offered rate whose
    attainment >= ``target``, None when none meets it."""
    passing = [(rate, attainment, p) for p in points
               if (rate := p["offered_rate"]) is not None and (attainment := p["attainment"]) is not None
               and attainment >= target]
    if not passing:
        return None
    rate, attainment, best = max(passing, key=lambda x: x[0])
    gpus = best["gpus"]
    return {
        "rate": rate, "attainment": attainment, "goodput": best["goodput"],
        "good_token_throughput": best["good_token_throughput"], "run_id": best["run_id"],
        "gpus": gpus, "rate_per_gpu": rate / gpus if gpus else None, "target": target,
    }
