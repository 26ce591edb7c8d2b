"""Per-run summary figures: every metric of docs/metrics.md for each run of a catalog.

Counts, throughput and attainment are SQL aggregates over the ``requests``
view; latency percentiles come from one band query per figure
(:mod:`llmlb_bench.metrics.distribution`); pacing, fairness, energy and
state from their modules. So any number in a report can be reproduced with
``llmlb query`` (docs/metrics.md gives the SQL).

* duration = latest request end (last token, or send time for requests
  that never produced a token) - earliest scheduled time (for imported
  runs without a common clock: the duration the tool measured);
* throughput = ok requests (output tokens) / duration;
* attainment = good requests / all requests (failed ones count as not good);
* goodput = good requests (their output tokens) / duration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmlb_bench.metrics.definitions import LATENCY_FIGURES, Definitions, figures
from llmlb_bench.metrics.distribution import band_sql, bands_by_run, describe
from llmlb_bench.metrics.energy import energy_and_cost
from llmlb_bench.metrics.fairness import fairness
from llmlb_bench.metrics.goodput import by_group, offered_rate
from llmlb_bench.metrics.pacing import DEFAULT_SAMPLE, pacing
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.sql import REQUEST_METRICS_VIEW
from llmlb_bench.metrics.state import serving_state
from llmlb_bench.schema import STATUSES
from llmlb_bench.store.views import Catalog

@dataclass(frozen=True)
class Options:
    """How to compute a summary (everything but the SLO, which callers pass on its own)."""

    definitions: Definitions = Definitions.vllm
    seed: int = 0                       # bootstrap replicates
    ci: bool = True                     # bootstrap confidence intervals on percentiles
    confidence: float = 0.95
    window_s: float = 10.0              # fairness windows
    price_per_hour: float | None = None  # whole fleet, overrides the GPU catalog
    pacing_sample: int = DEFAULT_SAMPLE


def _counts_sql(slo: Slo | None) -> str:
    status_cols = ", ".join(f"count(*) FILTER (WHERE status = '{s}') AS {s}" for s in STATUSES)
    good = (f"count(*) FILTER (WHERE {slo.predicate()}) AS good, "
            f"coalesce(sum(output_tokens) FILTER (WHERE {slo.predicate()}), 0)::BIGINT AS good_tokens"
            if slo else "NULL AS good, NULL AS good_tokens")
    return f"""
SELECT run_id, count(*) AS requests, {status_cols},
       min(scheduled_s) AS t0, max(scheduled_s) AS last_scheduled, max(end_s) AS t1,
       coalesce(sum(input_tokens) FILTER (WHERE status = 'ok'), 0)::BIGINT AS input_tokens,
       coalesce(sum(output_tokens) FILTER (WHERE status = 'ok'), 0)::BIGINT AS output_tokens,
       coalesce(sum(cached_tokens) FILTER (WHERE status = 'ok'), 0)::BIGINT AS cached_tokens,
       coalesce(sum(preemptions), 0)::BIGINT AS preemptions,
       count(*) FILTER (WHERE preemptions > 0) AS preempted_requests,
       {good}
FROM request_metrics GROUP BY run_id
"""


def _rows_by_run(cat: Catalog, sql: str) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in cat.query(sql).to_pylist()}


def summarize(cat: Catalog, slo: Slo | None = None, options: Options | None = None) -> list[dict[str, Any]]:
    """One summary dict per run that has request rows, in the catalog's order
    (run folders as given; folders found inside a results directory sorted by path)."""
    opt = options or Options()
    cat.con.execute(REQUEST_METRICS_VIEW)
    counts = _rows_by_run(cat, _counts_sql(slo))
    runs = [r for r in cat.runs_table.to_pylist() if r["run_id"] in counts]
    metas = metas_of(cat.runs_table)
    latency = {name: bands_by_run(cat.query(band_sql(fig.source))) for name, fig in figures(opt.definitions).items()}
    methods = {name: fig.method for name, fig in figures(opt.definitions).items()}
    classes = by_group(cat, slo, "slo_class")
    tenants = by_group(cat, slo, "tenant")
    durations = {k: _duration(c, metas[k]) for k, c in counts.items()}
    energy = energy_and_cost(cat, {k: {"meta": metas[k], "duration_s": durations[k],
                                       "output_tokens": counts[k]["output_tokens"],
                                       "good_tokens": counts[k]["good_tokens"]} for k in counts},
                             opt.price_per_hour)
    fair = fairness(cat, tenants, opt.window_s)
    state = serving_state(cat, counts, metas)
    pace = pacing(cat, {k: c["ok"] for k, c in counts.items()}, slo, opt.pacing_sample)
    out = []
    for run in runs:
        run_id = run["run_id"]
        c = counts[run_id]
        duration = durations[run_id]
        per_s = (lambda x: x / duration) if duration > 0 else (lambda x: None)
        s: dict[str, Any] = {
            "run_id": run_id, "label": run["label"], "policy": run["policy"],
            "backend": run["backend"], "status": run["status"],
            "requests": c["requests"], **{st: c[st] for st in STATUSES},
            "duration_s": duration,
            "offered_rate": offered_rate(metas[run_id], c["requests"], c["t0"], c["last_scheduled"]),
            "request_throughput": per_s(c["ok"]),
            "output_throughput": per_s(c["output_tokens"]),
            "input_throughput": per_s(c["input_tokens"]),
            "input_tokens": c["input_tokens"], "output_tokens": c["output_tokens"],
            "cached_tokens": c["cached_tokens"], "preemptions": c["preemptions"],
            "definitions": opt.definitions.value,
        }
        for name in LATENCY_FIGURES:
            s[name] = describe(latency[name].get(run_id), methods[name], seed=opt.seed, key=(run_id, name),
                               ci=opt.ci, level=opt.confidence)
        if slo is not None:
            s["slo"] = {
                "spec": slo.to_dict(),
                "good": c["good"],
                "good_tokens": c["good_tokens"],
                "attainment": c["good"] / c["requests"] if c["requests"] else None,
                "goodput": per_s(c["good"]),
                "good_token_throughput": per_s(c["good_tokens"]),
            }
        s["per_class"] = classes.get(run_id)
        s["per_tenant"] = tenants.get(run_id)
        s["pacing"] = pace.get(run_id)
        s["fairness"] = fair.get(run_id)
        s["energy"] = energy.get(run_id)
        s["state"] = state.get(run_id)
        out.append(s)
    return out


def _duration(c: dict[str, Any], meta: dict[str, Any]) -> float:
    """Request span; for imports whose requests each run on their own clock, the tool's measured duration."""
    imported = (meta.get("summary") or {}).get("import") or {}
    if imported.get("clock") == "per_request" and imported.get("duration_s"):
        return float(imported["duration_s"])
    return (c["t1"] - c["t0"]) if c["t1"] is not None and c["t0"] is not None else 0.0


def metas_of(runs_table: Any) -> dict[str, dict[str, Any]]:
    """run id -> run.json document, from a catalog's ``runs_table``."""
    return {r["run_id"]: json.loads(r["meta"]) if r["meta"] else {} for r in runs_table.to_pylist()}
