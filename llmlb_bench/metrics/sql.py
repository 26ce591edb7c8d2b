"""SQL building blocks over the ``requests`` view.

Definitions follow vLLM ``bench serve`` (see docs/ARCHITECTURE.md):
TTFT = first token - sent; E2E = last token - sent;
TPOT = (E2E - TTFT) / (output_tokens - 1) for requests with more than one
output token; ITL = every gap between consecutive tokens of a request.
Percentiles interpolate linearly between order statistics, like
``numpy.percentile`` (DuckDB ``quantile_cont``).
"""

from __future__ import annotations

PERCENTILES = (50, 90, 99)

REQUEST_METRICS_VIEW = """
CREATE OR REPLACE VIEW request_metrics AS
SELECT *,
       first_token_s - sent_s AS ttft_s,
       last_token_s - sent_s AS e2e_s,
       CASE WHEN output_tokens > 1 THEN (last_token_s - first_token_s) / (output_tokens - 1) END AS tpot_s,
       greatest(coalesce(last_token_s, sent_s, scheduled_s), coalesce(sent_s, scheduled_s)) AS end_s
FROM requests
"""

#: Token gaps with multiplicities: a segment of ``count`` tokens spaced
#: ``gap_s`` contributes ``count - 1`` gaps of ``gap_s``; consecutive segments
#: contribute the gap between the last token of one and the first of the next.
#: Keeping weights instead of expanding tokens keeps ITL cheap on simulated
#: runs, where one segment stands for thousands of tokens.
ITL_GAPS = """
WITH seg AS (
    SELECT run_id, request_id, k, s.start_s AS start_s, s.gap_s AS gap_s, s.count AS cnt,
           lag(s.start_s + s.gap_s * (s.count - 1)) OVER (PARTITION BY run_id, request_id ORDER BY k) AS prev_end
    FROM (SELECT run_id, request_id, unnest(token_times) AS s, generate_subscripts(token_times, 1) AS k
          FROM requests WHERE status = 'ok' AND token_times IS NOT NULL)
)
SELECT run_id, gap_s AS v, (cnt - 1)::BIGINT AS w FROM seg WHERE cnt > 1
UNION ALL
SELECT run_id, start_s - prev_end AS v, 1::BIGINT AS w FROM seg WHERE prev_end IS NOT NULL
"""


def weighted_percentiles_sql(source: str, percentiles: tuple[int, ...] = PERCENTILES) -> str:
    """Per-run linear-interpolation percentiles of values ``v`` with integer weights ``w``.

    Identical to ``numpy.percentile`` over the expanded sample: with
    N = sum(w) and h = p/100 * (N - 1), the result is
    x[floor(h)] + frac(h) * (x[ceil(h)] - x[floor(h)]), where x[i] is the
    value whose cumulative weight range contains index i.
    """
    hs = ", ".join(f"{p / 100!r} * (n - 1) AS h{p}" for p in percentiles)
    cols = []
    for p in percentiles:
        lo = f"min(v) FILTER (WHERE cw > floor(h{p}))"
        hi = f"min(v) FILTER (WHERE cw > ceil(h{p}))"
        cols.append(f"{lo} + (max(h{p}) - floor(max(h{p}))) * ({hi} - {lo}) AS p{p}")
    return f"""
WITH g AS (SELECT run_id, v, w FROM ({source}) WHERE w > 0),
c AS (SELECT run_id, v, w,
             (sum(w) OVER (PARTITION BY run_id ORDER BY v ROWS UNBOUNDED PRECEDING))::DOUBLE AS cw,
             (sum(w) OVER (PARTITION BY run_id))::DOUBLE AS n
      FROM g),
h AS (SELECT *, {hs} FROM c)
SELECT run_id, (sum(v * w) / sum(w))::DOUBLE AS mean, {', '.join(cols)}
FROM h GROUP BY run_id
"""


def latency_sql(column: str, percentiles: tuple[int, ...] = PERCENTILES) -> str:
    """Per-run mean and percentiles of a per-request metric over ok requests."""
    cols = ", ".join(f"quantile_cont({column}, {p / 100!r}) AS p{p}" for p in percentiles)
    return (f"SELECT run_id, avg({column}) AS mean, {cols} FROM request_metrics "
            f"WHERE status = 'ok' AND {column} IS NOT NULL GROUP BY run_id")
