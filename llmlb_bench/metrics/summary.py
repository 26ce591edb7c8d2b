"""Per-run summary figures: counts, throughput, latency percentiles, SLO attainment and goodput.

Every figure is one SQL aggregate over the ``requests`` view, so any number
in a report can be reproduced with ``llmlb query``.

* duration = latest request end (last token, or send time for requests
  that never produced a token) - earliest scheduled time;
* throughput = ok requests (output tokens) / duration;
* attainment = good requests / all requests (failed ones count as not good);
* goodput = good requests (their output tokens) / duration.
"""

from __future__ import annotations

from typing import Any

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.sql import ITL_GAPS, PERCENTILES, REQUEST_METRICS_VIEW, latency_sql, weighted_percentiles_sql
from llmlb_bench.schema import STATUSES
from llmlb_bench.store.views import Catalog

LATENCIES = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}


def _counts_sql(slo: Slo | None) -> str:
    status_cols = ", ".join(f"count(*) FILTER (WHERE status = '{s}') AS {s}" for s in STATUSES)
    good = (f"count(*) FILTER (WHERE {slo.predicate()}) AS good, "
            f"coalesce(sum(output_tokens) FILTER (WHERE {slo.predicate()}), 0)::BIGINT AS good_tokens"
            if slo else "NULL AS good, NULL AS good_tokens")
    return f"""
SELECT run_id, count(*) AS requests, {status_cols},
       min(scheduled_s) AS t0, max(end_s) AS t1,
       coalesce(sum(input_tokens) FILTER (WHERE status = 'ok'), 0)::BIGINT AS input_tokens,
       coalesce(sum(output_tokens) FILTER (WHERE status = 'ok'), 0)::BIGINT AS output_tokens,
       coalesce(sum(cached_tokens) FILTER (WHERE status = 'ok'), 0)::BIGINT AS cached_tokens,
       coalesce(sum(preemptions), 0)::BIGINT AS preemptions,
       {good}
FROM request_metrics GROUP BY run_id
"""


def _rows_by_run(cat: Catalog, sql: str) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in cat.query(sql).to_pylist()}


def summarize(cat: Catalog, slo: Slo | None = None) -> list[dict[str, Any]]:
    """One summary dict per run that has request rows, in the catalog's order
    (run folders as given; folders found inside a results directory sorted by path)."""
    cat.con.execute(REQUEST_METRICS_VIEW)
    counts = _rows_by_run(cat, _counts_sql(slo))
    lat = {name: _rows_by_run(cat, latency_sql(col)) for name, col in LATENCIES.items()}
    lat["itl"] = _rows_by_run(cat, weighted_percentiles_sql(ITL_GAPS))
    runs = cat.runs_table.to_pylist()
    out = []
    for run in runs:
        c = counts.get(run["run_id"])
        if c is None:
            continue
        duration = (c["t1"] - c["t0"]) if c["t1"] is not None and c["t0"] is not None else 0.0
        per_s = (lambda x: x / duration) if duration > 0 else (lambda x: None)
        s: dict[str, Any] = {
            "run_id": run["run_id"], "label": run["label"], "policy": run["policy"],
            "backend": run["backend"], "status": run["status"],
            "requests": c["requests"], **{st: c[st] for st in STATUSES},
            "duration_s": duration,
            "request_throughput": per_s(c["ok"]),
            "output_throughput": per_s(c["output_tokens"]),
            "input_throughput": per_s(c["input_tokens"]),
            "input_tokens": c["input_tokens"], "output_tokens": c["output_tokens"],
            "cached_tokens": c["cached_tokens"], "preemptions": c["preemptions"],
        }
        for name in ("ttft", "tpot", "itl", "e2e"):
            row = lat[name].get(run["run_id"]) or {}
            s[name] = {k: row.get(k) for k in ("mean", *(f"p{p}" for p in PERCENTILES))}
        if slo is not None:
            s["slo"] = {
                "spec": slo.to_dict(),
                "good": c["good"],
                "attainment": c["good"] / c["requests"] if c["requests"] else None,
                "goodput": per_s(c["good"]),
                "good_token_throughput": per_s(c["good_tokens"]),
            }
        out.append(s)
    return out
