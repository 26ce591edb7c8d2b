"""Serving state behind the latency figures: prefix cache, KV pressure, preemptions, queues, client health.

* prefix-cache hit rate = cached prompt tokens / prompt tokens of ok requests
  (token-weighted, as vLLM's ``prefix_cache_hits / prefix_cache_queries``);
* KV pressure per replica from ``series``: mean and peak of
  ``kv_blocks_used / kv_blocks_total``, and the share of samples at or above
  95% (where a paged engine starts preempting);
* queues: mean and peak of ``waiting`` and ``running`` over samples
  (samples are evenly spaced, so the mean over samples is the time mean);
* preempted requests = requests with ``preemptions > 0``;
* client self-check: the replayer's own figures from run.json
  (``summary.client``: dispatch lag, CPU per request, whether it was
  flagged as too slow to hold the schedule).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from llmlb_bench.metrics.run_figures import StateFigures, TargetState
from llmlb_bench.metrics.sql import exact_avg
from llmlb_bench.store.views import Catalog

KV_HIGH = 0.95

_SERIES_SQL = f"""
SELECT run_id, target, count(*) AS samples,
       {exact_avg('kv_blocks_used::DOUBLE / kv_blocks_total', 'kv_blocks_total > 0')} AS kv_mean,
       max(kv_blocks_used::DOUBLE / kv_blocks_total) FILTER (WHERE kv_blocks_total > 0) AS kv_max,
       avg(CASE WHEN kv_blocks_used::DOUBLE / kv_blocks_total >= {KV_HIGH} THEN 1.0 ELSE 0.0 END)
           FILTER (WHERE kv_blocks_total > 0) AS kv_high_share,
       avg(waiting) AS waiting_mean, max(waiting) AS waiting_max,
       avg(running) AS running_mean, max(running) AS running_max
FROM series GROUP BY ALL ORDER BY run_id, target
"""


def _worst(targets: Mapping[str, Mapping[str, Any]], key: str, how: Callable[[list[Any]], Any] = max) -> Any:
    vals = [t[key] for t in targets.values() if t[key] is not None]
    return how(vals) if vals else None


def _mean(targets: Mapping[str, Mapping[str, Any]], key: str) -> float | None:
    vals = [t[key] for t in targets.values() if t[key] is not None]
    return sum(vals) / len(vals) if vals else None


def serving_state(cat: Catalog, counts: Mapping[str, Mapping[str, Any]],
                  metas: Mapping[str, Mapping[str, Any]]) -> dict[str, StateFigures]:
    """``{run_id: {...}}``; ``counts`` holds each run's token and preemption totals from the summary SQL."""
    per_target: dict[str, dict[str, TargetState]] = {}
    for r in cat.query(_SERIES_SQL).to_pylist():
        per_target.setdefault(r["run_id"], {})[r["target"]] = {
            "samples": r["samples"], "kv_mean": r["kv_mean"], "kv_max": r["kv_max"],
            "kv_high_share": r["kv_high_share"], "waiting_mean": r["waiting_mean"], "waiting_max": r["waiting_max"],
            "running_mean": r["running_mean"], "running_max": r["running_max"]}
    out: dict[str, StateFigures] = {}
    for run_id, c in counts.items():
        targets = per_target.get(run_id) or {}
        out[run_id] = {
            "prefix_cache_hit_rate": c["cached_tokens"] / c["input_tokens"] if c["input_tokens"] else None,
            "preemptions": c["preemptions"],
            "preempted_requests": c["preempted_requests"],
            "kv_util_mean": _mean(targets, "kv_mean"),
            "kv_util_max": _worst(targets, "kv_max"),
            "kv_high_share": _mean(targets, "kv_high_share"),
            "waiting_mean": _mean(targets, "waiting_mean"),
            "waiting_max": _worst(targets, "waiting_max"),
            "running_mean": _mean(targets, "running_mean"),
            "running_max": _worst(targets, "running_max"),
            "per_target": targets or None,
            "client": ((metas.get(run_id) or {}).get("summary") or {}).get("client"),
        }
    return out
