"""Fairness across tenants: VTC service over time windows, Jain's index, slowdown ratio.

Service follows the Virtual Token Counter paper (Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024): a request's service is its
input tokens with weight 1 plus its output tokens with weight 2. Service is
counted when it is delivered: the input tokens at the first token (prefill
done), each output token at its own time (from ``token_times``, split
exactly across window boundaries).

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

from llmlb_bench.store.views import Catalog

INPUT_WEIGHT = 1
OUTPUT_WEIGHT = 2


def _window_sql(window_s: float) -> str:
    w = repr(float(window_s))
    return f"""
WITH t0 AS (SELECT run_id, min(scheduled_s) AS t0 FROM requests GROUP BY run_id),
multi AS (SELECT run_id FROM requests GROUP BY run_id HAVING count(DISTINCT coalesce(tenant, 'default')) > 1),
req AS (SELECT r.*, coalesce(r.tenant, 'default') AS tn, t0.t0 FROM requests r JOIN t0 USING (run_id)
        WHERE run_id IN (SELECT run_id FROM multi)),
seg AS (SELECT run_id, tn, t0, s.start_s AS st, s.gap_s AS g, s.count AS c
        FROM (SELECT run_id, tn, t0, unnest(token_times) AS s FROM req WHERE token_times IS NOT NULL)
        WHERE s.count > 0),
segwin AS (SELECT *, unnest(generate_series(floor((st - t0) / {w})::BIGINT,
                                            floor((st + g * (c - 1) - t0) / {w})::BIGINT)) AS j FROM seg),
outsvc AS (SELECT run_id, tn, j,
                  {OUTPUT_WEIGHT} * sum(CASE WHEN g <= 0 THEN c ELSE greatest(0,
                      least(c - 1, ceil((t0 + (j + 1) * {w} - st) / g) - 1)
                      - greatest(0, ceil((t0 + j * {w} - st) / g)) + 1) END) AS svc
           FROM segwin GROUP BY ALL),
insvc AS (SELECT run_id, tn, floor((first_token_s - t0) / {w})::BIGINT AS j,
                 {INPUT_WEIGHT} * sum(input_tokens) AS svc
          FROM req WHERE first_token_s IS NOT NULL GROUP BY ALL),
svc AS (SELECT run_id, tn, j, sum(svc)::DOUBLE AS svc FROM (SELECT * FROM outsvc UNION ALL SELECT * FROM insvc) GROUP BY ALL),
waits AS (SELECT run_id, tn, sent_s - t0 AS a, least(first_token_s, end_s) - t0 AS b FROM (
            SELECT *, greatest(coalesce(last_token_s, sent_s), sent_s) AS end_s FROM req) WHERE sent_s IS NOT NULL),
backlog AS (SELECT DISTINCT run_id, tn, unnest(generate_series(floor(a / {w})::BIGINT, (ceil(b / {w}) - 1)::BIGINT)) AS j
            FROM waits WHERE b > a),
perwin AS (SELECT b.run_id, b.j, count(*) AS k, sum(coalesce(s.svc, 0)) AS s1,
                  sum(coalesce(s.svc, 0) ^ 2) AS s2, max(coalesce(s.svc, 0)) AS hi, min(coalesce(s.svc, 0)) AS lo
           FROM backlog b LEFT JOIN svc s USING (run_id, tn, j) GROUP BY ALL HAVING count(*) > 1)
SELECT run_id, count(*) AS windows, max(hi - lo) AS gap_max, avg(hi - lo) AS gap_mean,
       avg(CASE WHEN s2 > 0 THEN s1 * s1 / (k * s2) ELSE 1 END) AS jain_service
FROM perwin GROUP BY run_id
"""


_TENANTS_SQL = f"""
SELECT run_id, coalesce(tenant, 'default') AS tn, count(*) AS requests,
       (coalesce(sum({INPUT_WEIGHT} * input_tokens) FILTER (WHERE first_token_s IS NOT NULL), 0)
         + coalesce(sum({OUTPUT_WEIGHT} * output_tokens), 0))::BIGINT AS service,
       avg(norm_latency_s) FILTER (WHERE status = 'ok') AS norm_latency_mean
FROM request_metrics GROUP BY ALL ORDER BY run_id, tn
"""


def jain(values: list[float]) -> float | None:
    """Jain's fairness index (sum x)^2 / (n sum x^2); None when undefined (no values, or all zero)."""
    sq = sum(x * x for x in values)
    return (sum(values) ** 2) / (len(values) * sq) if values and sq > 0 else None


def fairness(cat: Catalog, attainment: Mapping[str, Mapping[str, Mapping[str, Any]]],
             window_s: float = 10.0) -> dict[str, dict[str, Any]]:
    """``{run_id: {...}}`` for runs with two or more tenants (needs ``request_metrics``).

    ``attainment`` is :func:`llmlb_bench.metrics.goodput.by_group` over
    tenants (its ``attainment`` values are None without an SLO).
    """
    per_tenant: dict[str, dict[str, dict[str, Any]]] = {}
    for r in cat.query(_TENANTS_SQL).to_pylist():
        per_tenant.setdefault(r["run_id"], {})[r["tn"]] = {
            "requests": r["requests"], "service": r["service"], "norm_latency_mean": r["norm_latency_mean"]}
    windows = {r["run_id"]: r for r in cat.query(_window_sql(window_s)).to_pylist()}
    out: dict[str, dict[str, Any]] = {}
    for run_id, tenants in per_tenant.items():
        if len(tenants) < 2:
            continue
        att = [a["attainment"] for a in (attainment.get(run_id) or {}).values()]
        lat = [t["norm_latency_mean"] for t in tenants.values() if t["norm_latency_mean"]]
        win = windows.get(run_id) or {}
        out[run_id] = {
            "tenants": len(tenants),
            "window_s": window_s,
            "windows": win.get("windows", 0),
            "service_gap_max": win.get("gap_max"),
            "service_gap_mean": win.get("gap_mean"),
            "jain_service": win.get("jain_service"),
            "jain_attainment": jain(att) if att and None not in att else None,
            "slowdown_ratio": max(lat) / min(lat) if len(lat) > 1 else None,
            "per_tenant": tenants,
        }
    return out
