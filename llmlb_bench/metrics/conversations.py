"""Conversation-level figures: what a user of a multi-turn chat or an agent's task experiences.

A request-level SLO can be met by 99% of requests while most conversations
(or agent tasks) of 20 calls each have at least one slow call. The figures
(docs/metrics.md, "Conversations"), over the rows that carry a
``session_id`` (copied from the trace), grouping every request of a session
(its turns, and an agent's fan-out children and joins):

* **session completion time** = the session's last token - its first
  request's latency origin (arrival where the router is part of the system
  under test, :mod:`llmlb_bench.metrics.origin`), over sessions whose every
  request is ``ok``;
* **completed sessions** = sessions whose every request is ``ok``;
* **session attainment** (with an SLO) = sessions whose every request is
  good (meets its class's limits) / all sessions;
* **TTFT by turn**: TTFT p50 / p99 and count of the ok requests of each
  ``turn`` (1 = a session's first);
* **per-session tokens**: mean prompt, output and cached prompt tokens of a
  session, summed over its requests.
"""

from __future__ import annotations

from llmlb_bench.metrics.run_figures import ConversationFigures
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.sql import exact_avg
from llmlb_bench.store.views import Catalog

#: turns shown one by one; later turns are pooled into the last row
MAX_TURNS = 8


def _sessions_sql(slo: Slo | None) -> str:
    good = slo.predicate() if slo is not None else "NULL"
    return f"""
WITH s AS (
  SELECT run_id, session_id, count(*) AS n, count(*) FILTER (WHERE status = 'ok') AS ok,
         bool_and(coalesce(good, false)) AS good, min(origin_s) AS t0, max(last_token_s) AS t1,
         sum(input_tokens)::DOUBLE AS inp, sum(output_tokens)::DOUBLE AS outp,
         sum(coalesce(cached_tokens, 0))::DOUBLE AS cached
  FROM (SELECT *, ({good}) AS good FROM request_metrics) WHERE session_id IS NOT NULL GROUP BY 1, 2)
SELECT run_id, count(*) AS sessions, count(*) FILTER (WHERE ok = n) AS completed,
       sum(good::INTEGER)::BIGINT AS good, avg(n) AS requests_mean,
       quantile_cont(t1 - t0, [0.5, 0.9, 0.99]) FILTER (WHERE ok = n) AS completion,
       {exact_avg('t1 - t0', 'ok = n')} AS completion_mean,
       avg(inp) AS input_tokens, avg(outp) AS output_tokens, avg(cached) AS cached_tokens
FROM s GROUP BY 1
"""


_TURNS_SQL = f"""
SELECT run_id, least(turn, {MAX_TURNS}) AS turn, count(*) AS n,
       quantile_cont(ttft_s, 0.5) AS p50, quantile_cont(ttft_s, 0.99) AS p99
FROM request_metrics WHERE status = 'ok' AND turn IS NOT NULL AND ttft_s IS NOT NULL
GROUP BY 1, 2 ORDER BY 1, 2
"""


def conversations(cat: Catalog, slo: Slo | None) -> dict[str, ConversationFigures]:
    """run id -> its conversation figures, for the runs with sessions (needs the
    ``request_metrics`` view, :func:`llmlb_bench.metrics.sql.request_metrics_sql`)."""
    out: dict[str, ConversationFigures] = {}
    if cat.holds_no_value("requests", "session_id"):
        return out
    for r in cat.rows(_sessions_sql(slo)):
        p50, p90, p99 = r["completion"] or (None, None, None)
        out[r["run_id"]] = {
            "sessions": r["sessions"], "completed": r["completed"],
            "requests_mean": r["requests_mean"],
            "attainment": r["good"] / r["sessions"] if slo is not None else None,
            "completion_s": {"mean": r["completion_mean"], "p50": p50, "p90": p90, "p99": p99},
            "tokens": {"input_mean": r["input_tokens"], "output_mean": r["output_tokens"],
                       "cached_mean": r["cached_tokens"]},
            "ttft_by_turn": [],
        }
    if out:     # the view has every schema column, null in files written before it (store/views.py)
        for r in cat.rows(_TURNS_SQL):
            if r["run_id"] in out:
                out[r["run_id"]]["ttft_by_turn"].append(
                    {"turn": r["turn"], "pooled": r["turn"] == MAX_TURNS, "requests": r["n"],
                     "p50": r["p50"], "p99": r["p99"]})
    return out
