"""Counts of every run, SLO class, tenant and LoRA adapter, from one scan.

The scan groups requests into cells (run, SLO class, tenant, adapter, status,
good, and the tenth of the run's arrival window the steady state reads: :mod:`llmlb_bench.metrics.steady`)
with plain sums, kept in a small temporary table; there are few cells, so rolling them up to
runs, runs x classes, runs x tenants and runs x adapters costs nothing, and every group's counts
come out of the same pass as the run's (a ``FILTER`` per status and
grouping sets cost several times more per row), and so do the steady state's tenths (over ten million
rows the one scan costs 1.45 CPU-s where the counts' and the steady state's apart cost 1.3 and 0.76).
"""

from __future__ import annotations

from typing import Callable, Iterable, Literal, TypedDict, TypeVar

from llmlb_bench.metrics.fairness import INPUT_WEIGHT, OUTPUT_WEIGHT
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.sql import exact_partial_sum, exact_total
from llmlb_bench.schema import ArrowRow, Status
from llmlb_bench.store.views import Catalog

GROUPS = ("slo_class", "tenant", "adapter")
#: the group of a row whose column is null: the default class and tenant; the base model
GROUP_NULL = {"slo_class": "default", "tenant": "default", "adapter": "base"}
#: sums over the ok rows that read their own columns (tokens per delivery, speculative decoding's counts:
#: :mod:`llmlb_bench.metrics.speculative`), null where no ok row has a value
OkSum = Literal["delivered_tokens", "deliveries", "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens"]
OK_SUMS: tuple[OkSum, ...] = ("delivered_tokens", "deliveries", "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")
#: ("run", run_id) or (group column, run_id, group)
Unit = tuple[str, ...]
N = TypeVar("N", int, float)


class Counts(TypedDict):
    """The counts of one run, or of one SLO class, tenant or adapter of it (:func:`rollup`).

    Token sums are over the ok requests (``preemptions`` over all); ``t0`` / ``last_scheduled`` are the first
    and last scheduled time, ``t1`` the last end; ``id_min`` / ``id_max`` the request ids' range. None where no
    row has a value: ``good`` and ``good_tokens`` without an SLO, ``energy_j`` without energy, the OK_SUMS
    where no ok row has the column.
    """

    requests: int
    ok: int                 # requests by status (schema.STATUSES)
    error: int
    timeout: int
    rejected: int
    not_sent: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    good: int | None
    good_tokens: int | None
    preemptions: int
    preempted_requests: int
    t0: float | None
    last_scheduled: float | None
    t1: float | None
    id_min: int
    id_max: int
    energy_j: float | None
    service: int            # weighted tokens (INPUT_WEIGHT, OUTPUT_WEIGHT)
    nl_sum: float           # norm_latency_s over the ok rows: its sum and count, for the mean
    nl_n: int
    norm_latency_mean: float | None
    reasoning_tokens: int
    reasoning_requests: int
    delivered_tokens: int | None
    deliveries: int | None
    spec_drafts: int | None
    spec_draft_tokens: int | None
    spec_accepted_tokens: int | None
    deliveries_unknown: int


#: the temporary table of request cells that :func:`cells` fills (the steady state reads its tenths from it)
CELLS = "request_cells"
#: the TTFT of an ok request (null for the others): the cells sum it for the steady state's mean per tenth
TTFT_OK = "CASE WHEN status = 'ok' THEN ttft_s END"


def cells_sql(slo: Slo | None, part: str) -> str:
    """SQL filling :data:`CELLS`: the requests grouped into cells by run, SLO class, tenant, adapter,
    status, good and ``part`` (an SQL expression: the steady state's tenth of the arrival window), with
    plain sums, and the float sums as :func:`~llmlb_bench.metrics.sql.exact_partial_sum`'s unrounded
    parts, so that any grouping of the cells adds them up to the exact sums of its rows."""
    return f"""
CREATE OR REPLACE TEMP TABLE {CELLS} AS
SELECT run_id, slo_class, tenant, adapter, status, good, {part} AS part, count(*) AS n,
       sum(input_tokens)::BIGINT AS input_tokens, sum(output_tokens)::BIGINT AS output_tokens,
       sum(cached_tokens)::BIGINT AS cached_tokens, sum(preemptions)::BIGINT AS preemptions,
       sum((preemptions > 0)::INTEGER)::BIGINT AS preempted_requests,
       min(scheduled_s) AS t0, max(scheduled_s) AS last_scheduled, max(end_s) AS t1,
       min(request_id) AS id_min, max(request_id) AS id_max, {exact_partial_sum('energy_j', 'energy_j')},
       sum(CASE WHEN first_token_s IS NOT NULL THEN input_tokens END)::BIGINT AS prefilled_tokens,
       {exact_partial_sum('norm_latency_s', 'nl_sum')}, count(norm_latency_s) AS nl_n,
       sum(reasoning_tokens)::BIGINT AS reasoning_tokens, count(nullif(reasoning_tokens, 0)) AS reasoning_requests,
       sum(output_tokens) FILTER (WHERE deliveries > 0)::BIGINT AS delivered_tokens,
       sum(deliveries)::BIGINT AS deliveries, count(*) FILTER (WHERE deliveries IS NULL) AS deliveries_unknown,
       sum(spec_drafts)::BIGINT AS spec_drafts, sum(spec_draft_tokens)::BIGINT AS spec_draft_tokens,
       sum(spec_accepted_tokens)::BIGINT AS spec_accepted_tokens,
       {exact_partial_sum(TTFT_OK, 'ttft')}, count({TTFT_OK}) AS ttft_n
FROM (SELECT * REPLACE (coalesce(slo_class, 'default') AS slo_class, coalesce(tenant, 'default') AS tenant,
                        coalesce(adapter, 'base') AS adapter),
             ({slo.predicate() if slo else 'NULL'}) AS good
      FROM request_metrics)
GROUP BY ALL
"""


#: the cells of :data:`CELLS` over all their tenths: the rows :func:`rollup` reads
_SUMS = ("n", "input_tokens", "output_tokens", "cached_tokens", "preemptions", "preempted_requests", "prefilled_tokens",
         "nl_n", "reasoning_tokens", "reasoning_requests", "delivered_tokens", "deliveries", "deliveries_unknown",
         "spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")
COUNTS_SQL = f"""
SELECT run_id, slo_class, tenant, adapter, status, good, {', '.join(f'sum({k})::BIGINT AS {k}' for k in _SUMS)},
       min(t0) AS t0, max(last_scheduled) AS last_scheduled, max(t1) AS t1, min(id_min) AS id_min,
       max(id_max) AS id_max, {exact_total('energy_j')} AS energy_j, {exact_total('nl_sum')} AS nl_sum
FROM {CELLS} GROUP BY ALL
"""


def cells(cat: Catalog, slo: Slo | None, part: str = "NULL::INTEGER") -> list[ArrowRow]:
    """Fill :data:`CELLS` from one scan of ``request_metrics`` (cut into tenths by ``part``: see
    :func:`cells_sql`) and return its cells over all tenths, for :func:`rollup`."""
    cat.con.execute(cells_sql(slo, part))
    return cat.rows(COUNTS_SQL)


def _empty(c: ArrowRow) -> Counts:
    """Nothing counted yet, for the unit of cell ``c`` (the request ids' range starts at its own)."""
    return {"requests": 0, "ok": 0, "error": 0, "timeout": 0, "rejected": 0, "not_sent": 0, "input_tokens": 0,
            "output_tokens": 0, "cached_tokens": 0, "good": 0, "good_tokens": 0, "preemptions": 0,
            "preempted_requests": 0, "t0": None, "last_scheduled": None, "t1": None, "id_min": c["id_min"], "id_max": c["id_max"],
            "energy_j": None, "service": 0, "nl_sum": 0.0, "nl_n": 0, "norm_latency_mean": None,
            "reasoning_tokens": 0, "reasoning_requests": 0, "delivered_tokens": None, "deliveries": None,
            "spec_drafts": None, "spec_draft_tokens": None, "spec_accepted_tokens": None, "deliveries_unknown": 0}


def _merge(m: Counts, c: ArrowRow) -> None:
    """Add one cell (a row of :func:`cells` as pyarrow hands it, untyped) to ``m``."""
    n: int = c["n"]
    status: Status = c["status"]
    m["requests"] += n
    m[status] = m.get(status, 0) + n
    if status == "ok":
        m["input_tokens"] += c["input_tokens"] or 0
        m["output_tokens"] += c["output_tokens"] or 0
        m["cached_tokens"] += c["cached_tokens"] or 0
        m["nl_sum"] += c["nl_sum"] or 0.0
        m["nl_n"] += c["nl_n"]
        m["reasoning_tokens"] += c["reasoning_tokens"] or 0
        m["reasoning_requests"] += c["reasoning_requests"]
        m["deliveries_unknown"] += c["deliveries_unknown"]
        for k in OK_SUMS:     # null (None) where no ok row has a value, as SQL's sum
            if c[k] is not None:
                m[k] = (m[k] or 0) + c[k]
    if c["good"]:             # good and good_tokens start at 0; None only once rolled up without an SLO
        m["good"] = (m["good"] or 0) + n
        m["good_tokens"] = (m["good_tokens"] or 0) + (c["output_tokens"] or 0)
    m["preemptions"] += c["preemptions"] or 0
    m["preempted_requests"] += c["preempted_requests"] or 0
    m["service"] += INPUT_WEIGHT * (c["prefilled_tokens"] or 0) + OUTPUT_WEIGHT * (c["output_tokens"] or 0)
    m["t0"] = _extreme(min, m["t0"], c["t0"])
    m["last_scheduled"] = _extreme(max, m["last_scheduled"], c["last_scheduled"])
    m["t1"] = _extreme(max, m["t1"], c["t1"])
    m["id_min"] = min(m["id_min"], c["id_min"])
    m["id_max"] = max(m["id_max"], c["id_max"])
    if c["energy_j"] is not None:
        m["energy_j"] = (m["energy_j"] or 0.0) + c["energy_j"]


def _extreme(pick: Callable[[N, N], N], held: N | None, new: N | None) -> N | None:
    """``pick`` of the two where both are known, else the known one (None where neither is)."""
    return held if new is None else new if held is None else pick(held, new)


def rollup(cells: list[ArrowRow], slo: Slo | None) -> dict[Unit, Counts]:
    """Counts per run (unit ``("run", run_id)``) and per run and group (``(column, run_id, group)``).

    Groups are kept only for runs with more than one SLO class, tenant or adapter.
    ``good`` and ``good_tokens`` are None without an SLO.
    """
    # in a fixed order, so sums of floats come out the same to the last bit whatever order DuckDB returned
    rows = sorted(cells, key=lambda c: (c["run_id"], c["slo_class"], c["tenant"], c["adapter"],
                                                    c["status"], str(c["good"])))
    out: dict[Unit, Counts] = {}
    for c in rows:
        for unit in (("run", c["run_id"]), *((col, c["run_id"], c[col]) for col in GROUPS)):
            m = out.get(unit)
            if m is None:
                m = out[unit] = _empty(c)
            _merge(m, c)
    several = {run for col in GROUPS for run in _runs_with_several(out, col)}
    out = {u: m for u, m in out.items() if u[0] == "run" or u[1] in several}
    for m in out.values():
        m["norm_latency_mean"] = m["nl_sum"] / m["nl_n"] if m["nl_n"] else None
        if slo is None:
            m["good"] = m["good_tokens"] = None
    return out


def _runs_with_several(units: Iterable[Unit], col: str) -> set[str]:
    seen: dict[str, int] = {}
    for u in units:
        if u[0] == col:
            seen[u[1]] = seen.get(u[1], 0) + 1
    return {run for run, n in seen.items() if n > 1}
