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

from typing import Iterable, Mapping, cast

from llmlb_bench.metrics.counts import Counts
from llmlb_bench.metrics.meta import table
from llmlb_bench.metrics.run_figures import StateFigures, TargetState
from llmlb_bench.metrics.sql import exact_avg
from llmlb_bench.run_summary import ClientSummary
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


def _worst(values: Iterable[float | None]) -> float | None:
    """The largest of the targets' values (None where no target has one)."""
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _mean(values: Iterable[float | None]) -> float | None:
    """The targets' mean (None where no target has a value)."""
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _client(meta: Mapping[str, object]) -> ClientSummary | None:
    """run.json's ``summary.client``, the replayer's (run_summary.ClientSummary): JSON hands it back untyped,
    and it is the document that section declares."""
    client = table(meta, "summary").get("client")
    return cast(ClientSummary, client) if isinstance(client, Mapping) else None


def serving_state(cat: Catalog, counts: Mapping[str, Counts],
                  metas: Mapping[str, Mapping[str, object]]) -> dict[str, StateFigures]:
    """``{run_id: {...}}``; ``counts`` holds each run's token and preemption totals from the summary SQL."""
    per_target: dict[str, dict[str, TargetState]] = {}
    for r in cat.rows(_SERIES_SQL):
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
            "kv_util_mean": _mean(t["kv_mean"] for t in targets.values()),
            "kv_util_max": _worst(t["kv_max"] for t in targets.values()),
            "kv_high_share": _mean(t["kv_high_share"] for t in targets.values()),
            "waiting_mean": _mean(t["waiting_mean"] for t in targets.values()),
            "waiting_max": _worst(t["waiting_max"] for t in targets.values()),
            "running_mean": _mean(t["running_mean"] for t in targets.values()),
            "running_max": _worst(t["running_max"] for t in targets.values()),
            "per_target": targets or None,
            "client": _client(metas.get(run_id) or {}),
        }
    return out
