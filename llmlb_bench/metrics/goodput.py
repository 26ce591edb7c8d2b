"""SLO attainment per group, offered load, and maximum goodput over runs at several loads.

* attainment of a group (an SLO class, a tenant) = its good requests / all
  its requests (failed requests count as not good);
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

from typing import Any, Iterable, Mapping

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.store.views import Catalog

#: Columns attainment can be broken down by (null values read as "default").
GROUPS = ("slo_class", "tenant")


#: Per-group latency columns (vLLM per-request definitions, linear percentiles).
GROUP_LATENCIES = ("ttft_s", "tpot_s", "e2e_s")
GROUP_QUANTILES = (0.5, 0.99)


def by_group(cat: Catalog, slo: Slo | None, column: str) -> dict[str, dict[str, dict[str, Any]]]:
    """``{run_id: {group: {requests, ok, good, good_tokens, attainment, ttft_p50, ..., e2e_p99}}}``.

    Needs the ``request_metrics`` view. Latency columns are in seconds.
    """
    if column not in GROUPS:
        raise ValueError(f"unknown group column {column!r}")
    good = (f"count(*) FILTER (WHERE {slo.predicate()}) AS good, "
            f"coalesce(sum(output_tokens) FILTER (WHERE {slo.predicate()}), 0)::BIGINT AS good_tokens"
            if slo else "NULL::BIGINT AS good, NULL::BIGINT AS good_tokens")
    qs = ", ".join(repr(q) for q in GROUP_QUANTILES)
    lat = ", ".join(f"quantile_cont({c}, [{qs}]) FILTER (WHERE status = 'ok') AS {c}" for c in GROUP_LATENCIES)
    rows = cat.query(f"""
        SELECT run_id, coalesce({column}, 'default') AS grp, count(*) AS requests,
               count(*) FILTER (WHERE status = 'ok') AS ok, {good}, {lat}
        FROM request_metrics GROUP BY ALL ORDER BY run_id, grp""").to_pylist()
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        g: dict[str, Any] = {
            "requests": r["requests"], "ok": r["ok"], "good": r["good"], "good_tokens": r["good_tokens"],
            "attainment": None if r["good"] is None else r["good"] / r["requests"],
        }
        for c in GROUP_LATENCIES:
            values = r[c] or [None] * len(GROUP_QUANTILES)
            for q, v in zip(GROUP_QUANTILES, values):
                g[f"{c[:-2]}_p{q * 100:g}"] = v
        out.setdefault(r["run_id"], {})[r["grp"]] = g
    return out


def offered_rate(meta: Mapping[str, Any], requests: int, first_s: float | None, last_s: float | None) -> float | None:
    """Requests per second the run was offered (see the module docstring)."""
    config = meta.get("config") or {}
    for declared in (config.get("offered_rate"), (config.get("sweep") or {}).get("rate")):
        if isinstance(declared, (int, float)) and declared > 0:
            return float(declared)
    if requests > 1 and first_s is not None and last_s is not None and last_s > first_s:
        return (requests - 1) / (last_s - first_s)
    return None


def max_goodput(summaries: Iterable[Mapping[str, Any]], target: float = 0.9) -> dict[str, Any] | None:
    """The run with the highest offered rate whose SLO attainment >= ``target`` (DistServe).

    ``summaries`` are run summaries of one configuration at several loads
    (from :func:`llmlb_bench.metrics.summary.summarize` with an SLO). Returns
    ``{rate, attainment, goodput, good_token_throughput, run_id, gpus,
    rate_per_gpu}`` or None when no run meets the target.
    """
    passing = [s for s in summaries
               if s.get("offered_rate") is not None and s.get("slo")
               and s["slo"]["attainment"] is not None and s["slo"]["attainment"] >= target]
    if not passing:
        return None
    best = max(passing, key=lambda s: s["offered_rate"])
    gpus = (best.get("energy") or {}).get("gpus")
    return {
        "rate": best["offered_rate"], "attainment": best["slo"]["attainment"], "goodput": best["slo"]["goodput"],
        "good_token_throughput": best["slo"]["good_token_throughput"], "run_id": best["run_id"],
        "gpus": gpus, "rate_per_gpu": best["offered_rate"] / gpus if gpus else None, "target": target,
    }
