"""Fairness across tenants: VTC service over time windows, Jain's index, slowdown ratio.

Service follows the Virtual Token Counter paper (Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024): a request's service is its
input tokens with weight 1 plus its output tokens with weight 2. Service is
counted when it is delivered: the input tokens at the first token (prefill
done), the output tokens at their times, taken as evenly spaced between the
first and the last token (split exactly across window boundaries). Reading
only those two times, not every token's, keeps the windows cheap on ten
million requests; a stall inside a request shifts at most its own tokens
by less than the stall.

VTC's guarantee is about *backlogged* tenants: a tenant that asks for little
is not wronged by receiving little. A tenant is backlogged in a window when
one of its requests was waiting in it, i.e. the window overlaps
[sent, first token) of the request (queueing and prefill). Over windows of
``window_s`` seconds from the run's first scheduled time, counting only
windows with at least two backlogged tenants:

* service gap (VTC's fairness measure) = max - min service received in the
  window among backlogged tenants; reported as its maximum and mean;
* Jain's index over per-tenant normalised service = (sum S)^2 / (k sum S^2)
  over the k backlogged tenants' service rates S (service / window length,
  weight 1 each), averaged over windows; 1 is perfectly even;
* Jain's index over per-tenant SLO attainment (whole run, every tenant);
* slowdown ratio = max / min over tenants of the mean normalized latency
  (E2E / output tokens) of their ok requests. It compares tenants against
  each other, so the unknown unloaded latency cancels when tenants share a
  per-token cost; with very different prompt lengths, read it with care.

Everything is computed only for runs with at least two tenants.
"""

from __future__ import annotations

from typing import Any, Mapping

from llmlb_bench.metrics.sql import quote
from llmlb_bench.store.views import Catalog

INPUT_WEIGHT = 1
OUTPUT_WEIGHT = 2


def _window_sql(runs: Mapping[str, float], window_s: float) -> str:
    """Per run: the VTC service gap and Jain index over windows (``runs``: run id -> first scheduled time).

    Most requests wait, and stream, within one window; only those spanning
    several are expanded window by window, which keeps the scan cheap.
    """
    w = repr(float(window_s))
    t0 = "CASE run_id " + " ".join(f"WHEN {quote(r)} THEN {t!r}" for r, t in runs.items()) + " END"
    return f"""
WITH req AS (
    SELECT run_id, coalesce(tenant, 'default') AS tn, sent_s - t0 AS s, first_token_s - t0 AS f,
           last_token_s - t0 AS l, greatest(coalesce(last_token_s, sent_s), sent_s) - t0 AS e,
           input_tokens AS n_in, output_tokens AS n_out,
           CASE WHEN output_tokens > 1 THEN (last_token_s - first_token_s) / (output_tokens - 1) ELSE 0 END AS g
    FROM (SELECT *, {t0} AS t0 FROM requests WHERE run_id IN ({', '.join(quote(r) for r in runs)}))),
streams AS (SELECT *, floor(f / {w})::BIGINT AS jf, floor(l / {w})::BIGINT AS jl
            FROM req WHERE f IS NOT NULL AND n_out > 0),
outsvc AS (
    SELECT run_id, tn, jf AS j, {OUTPUT_WEIGHT} * n_out AS svc FROM streams WHERE jf = jl
    UNION ALL
    SELECT run_id, tn, j, {OUTPUT_WEIGHT} * (CASE WHEN g <= 0 THEN n_out ELSE greatest(0,
               least(n_out - 1, ceil(((j + 1) * {w} - f) / g) - 1) - greatest(0, ceil((j * {w} - f) / g)) + 1) END)
    FROM (SELECT *, unnest(generate_series(jf, jl)) AS j FROM streams WHERE jf < jl)),
svc AS (SELECT run_id, tn, j, sum(svc)::DOUBLE AS svc FROM (
            SELECT * FROM outsvc
            UNION ALL
            SELECT run_id, tn, floor(f / {w})::BIGINT, {INPUT_WEIGHT} * n_in FROM req WHERE f IS NOT NULL)
        GROUP BY ALL),
waits AS (SELECT run_id, tn, floor(s / {w})::BIGINT AS ja, (ceil(coalesce(f, e) / {w}) - 1)::BIGINT AS jb
          FROM req WHERE s IS NOT NULL AND coalesce(f, e) > s),
backlog AS (SELECT DISTINCT run_id, tn, j FROM (
                SELECT run_id, tn, ja AS j FROM waits WHERE ja = jb
                UNION ALL
                SELECT run_id, tn, unnest(generate_series(ja, jb)) FROM waits WHERE ja < jb)),
perwin AS (SELECT b.run_id, b.j, count(*) AS k, sum(coalesce(s.svc, 0)) AS s1,
                  sum(coalesce(s.svc, 0) ^ 2) AS s2, max(coalesce(s.svc, 0)) AS hi, min(coalesce(s.svc, 0)) AS lo
           FROM backlog b LEFT JOIN svc s USING (run_id, tn, j) GROUP BY ALL HAVING count(*) > 1)
SELECT run_id, count(*) AS windows, max(hi - lo) AS gap_max, avg(hi - lo) AS gap_mean,
       avg(CASE WHEN s2 > 0 THEN s1 * s1 / (k * s2) ELSE 1 END) AS jain_service
FROM perwin GROUP BY run_id
"""


def service_columns() -> str:
    """Aggregates for the per-tenant counts query: VTC service delivered and mean normalized latency."""
    return (f"(coalesce(sum({INPUT_WEIGHT} * input_tokens) FILTER (WHERE first_token_s IS NOT NULL), 0) "
            f"+ coalesce(sum({OUTPUT_WEIGHT} * output_tokens), 0))::BIGINT AS service, "
            f"avg(norm_latency_s) FILTER (WHERE status = 'ok') AS norm_latency_mean")


def jain(values: list[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2); None when undefined (no values, or all zero)."""
    sq = sum(x * x for x in values)
    return (sum(values) ** 2) / (len(values) * sq) if values and sq > 0 else None


def fairness(cat: Catalog, runs: Mapping[str, float], tenants: Mapping[str, Mapping[str, Mapping[str, Any]]],
             window_s: float = 10.0) -> dict[str, dict[str, Any]]:
    """``{run_id: {...}}`` for ``runs`` (run id -> first scheduled time), the runs with two or more tenants.

    ``tenants`` maps run ids to per-tenant figures from the per-group counts
    query (:func:`service_columns`; ``attainment`` None without an SLO).
    """
    if not runs:
        return {}
    windows = {r["run_id"]: r for r in cat.query(_window_sql(runs, window_s)).to_pylist()}
    out: dict[str, dict[str, Any]] = {}
    for run_id in runs:
        per = tenants.get(run_id) or {}
        att = [t["attainment"] for t in per.values()]
        lat = [t["norm_latency_mean"] for t in per.values() if t["norm_latency_mean"]]
        win = windows.get(run_id) or {}
        out[run_id] = {
            "tenants": len(per),
            "window_s": window_s,
            "windows": win.get("windows", 0),
            "service_gap_max": win.get("gap_max"),
            "service_gap_mean": win.get("gap_mean"),
            "jain_service": win.get("jain_service"),
            "jain_attainment": jain(att) if att and None not in att else None,
            "slowdown_ratio": max(lat) / min(lat) if len(lat) > 1 else None,
            "per_tenant": {t: {k: d[k] for k in ("requests", "service", "norm_latency_mean")} for t, d in per.items()},
        }
    return out
