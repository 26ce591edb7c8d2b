"""SQL building blocks over the ``requests`` view.

Per-request times follow vLLM ``bench serve`` (see docs/metrics.md), counted
from each row's latency origin (arrival or send, :mod:`llmlb_bench.metrics.origin`):
TTFT = first token - origin; E2E = last token - origin;
TPOT = (E2E - TTFT) / (output_tokens - 1) for requests with more than one
output token; ITL = every gap between consecutive tokens of a request;
normalized latency = E2E / output tokens (Etalon), which is also what
GuideLLM calls TPOT (see :mod:`llmlb_bench.metrics.definitions`).

Reasoning requests (``reasoning_tokens`` > 0 of their ``output_tokens``) also
get the answer's figures: TTFA = first answer token - origin (the first token
for a request without reasoning, null for one that never answered); answer
TPOT = (last token - first answer token) / (answer tokens - 1).
"""

from __future__ import annotations

from typing import Iterable


def origin_sql(arrival_runs: Iterable[str]) -> str:
    """Each row's latency origin: ``scheduled_s`` for the runs in ``arrival_runs``, ``sent_s`` for the others."""
    runs = list(arrival_runs)
    if not runs:
        return "sent_s"
    return f"CASE WHEN run_id IN ({', '.join(map(quote, runs))}) THEN scheduled_s ELSE sent_s END"


def request_metrics_sql(arrival_runs: Iterable[str] = ()) -> str:
    """The ``request_metrics`` view: ``requests`` plus each row's latency origin and per-request figures.

    Columns the results predate (every run's files lack them, e.g. ``adapter``) are in
    ``requests`` as nulls (:class:`llmlb_bench.store.views.Catalog`), so one query serves old and new runs.

    ``origin_s`` is ``scheduled_s`` (arrival) for ``arrival_runs`` and
    ``sent_s`` for the others (:mod:`llmlb_bench.metrics.origin`); ``wait_s``
    = ``sent_s - scheduled_s`` is the router wait (simulator) or the client's
    lag (replay).
    """
    return f"""
CREATE OR REPLACE VIEW request_metrics AS
SELECT *,
       first_token_s - origin_s AS ttft_s,
       last_token_s - origin_s AS e2e_s,
       CASE WHEN output_tokens > 1 THEN (last_token_s - first_token_s) / (output_tokens - 1) END AS tpot_s,
       CASE WHEN output_tokens > 0 THEN (last_token_s - origin_s) / output_tokens END AS norm_latency_s,
       answer_s - origin_s AS ttfa_s,
       CASE WHEN output_tokens - coalesce(reasoning_tokens, 0) > 1
            THEN (last_token_s - answer_s) / (output_tokens - coalesce(reasoning_tokens, 0) - 1) END AS answer_tpot_s,
       greatest(coalesce(last_token_s, sent_s, scheduled_s), coalesce(sent_s, scheduled_s)) AS end_s
FROM (SELECT *, {origin_sql(arrival_runs)} AS origin_s,
             sent_s - scheduled_s AS wait_s,
             CASE WHEN coalesce(reasoning_tokens, 0) > 0 THEN first_answer_s ELSE first_token_s END AS answer_s
      FROM requests)
"""


def itl_gaps_sql(table: str = "requests") -> str:
    """``(run_id, v, w)``: the gaps between deliveries of the ok requests of ``table``, with
    multiplicities (ITL: see docs/metrics.md).

    A segment of ``count`` tokens spaced ``gap_s`` > 0 contributes ``count - 1``
    gaps of ``gap_s``; a segment of gap 0 is one delivery of ``count`` tokens
    (a stream chunk, a bundled verify step) and contributes none; consecutive
    segments contribute the gap between the last token of one and the first
    of the next. Keeping weights instead of
    expanding tokens keeps ITL cheap on simulated runs, where one segment
    stands for thousands of tokens; list functions (not a window over
    unnested rows) keep it cheap on replayed runs.
    """
    ok = "status = 'ok'" if table == "requests" else "TRUE"
    return f"""
SELECT run_id, s.gap_s AS v, (s.count - 1)::BIGINT AS w
FROM (SELECT run_id, unnest(token_times) AS s FROM {table} WHERE {ok})
WHERE s.count > 1 AND s.gap_s > 0
UNION ALL
SELECT run_id, unnest(list_transform(range(1, len(token_times)), lambda i: token_times[i + 1].start_s
       - token_times[i].start_s - token_times[i].gap_s * (token_times[i].count - 1))) AS v, 1::BIGINT AS w
FROM {table} WHERE {ok} AND len(token_times) > 1
"""


#: DOUBLE values are added as DECIMAL(38, 18): exact integer additions at 1e-18 (well below a double's last digit
#: for any time, energy or ratio a run holds), up to a sum of 1.7e20 (DuckDB reports an overflow beyond)
_EXACT = "DECIMAL(38, 18)"
#: values at least this large (no time, energy or ratio of a run is) are added apart, as DOUBLE: a decimal
#: could not hold them, and a report should not fail on one absurd value
_EXACT_BELOW = "1e15"


def exact_sum(expr: str, where: str | None = None) -> str:
    """SQL: the sum of a DOUBLE expression over a group, the same to the last bit however DuckDB's
    threads split and order the rows (``sum`` over DOUBLE adds in scheduling order, so its last digits
    move from one report to the next).

    Values under 1e15 in size are summed exactly as decimals and the total rounded once; the others
    (NaN and infinities, which no decimal holds, and absurdly large values) are added apart, as DOUBLE:
    NaN and infinities give the same result in any order. ``where`` filters the rows, as an
    aggregate's ``FILTER`` would.
    """
    f = f" FILTER (WHERE {where})" if where else ""
    exact, apart = _exact_terms(expr)
    return f"({exact}{f}::DOUBLE + {apart}{f})"


def _exact_terms(expr: str) -> tuple[str, str]:
    """The two sums of :func:`exact_sum`: the small values' as a DECIMAL (exact, not yet rounded), the
    others' as DOUBLE."""
    small = f"abs({expr}) < {_EXACT_BELOW}"
    return f"sum(CAST(CASE WHEN {small} THEN {expr} END AS {_EXACT}))", f"sum(CASE WHEN {small} THEN 0.0 ELSE {expr} END)"


def exact_partial_sum(expr: str, name: str) -> str:
    """SQL: :func:`exact_sum`'s two sums over a group, unrounded, as the columns ``{name}_exact`` and
    ``{name}_apart`` of a table of partial sums (cells), for :func:`exact_total` to add up over any
    grouping of the cells: the decimal parts add exactly, so the total is :func:`exact_sum`'s over the
    same rows to the last bit, however the rows were split into cells."""
    exact, apart = _exact_terms(expr)
    return f"{exact} AS {name}_exact, {apart} AS {name}_apart"


def exact_total(name: str) -> str:
    """SQL: the sum of the partial sums :func:`exact_partial_sum` named ``name`` over a group of cells."""
    return f"(sum({name}_exact)::DOUBLE + sum({name}_apart))"


def exact_avg(expr: str, where: str | None = None) -> str:
    """SQL: the mean of a DOUBLE expression over a group, from :func:`exact_sum` (order-independent)."""
    return f"({exact_sum(expr, where)} / count({expr}){f' FILTER (WHERE {where})' if where else ''})"


def quote(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
