"""Whether a run is in steady state, or its means describe a queue that never settled.

The run's arrival window is cut into ten equal parts by arrival time; per
part, the mean TTFT of its ok requests (counted from the latency origin, so
a router-side queue shows) and its attainment. A run is flagged when

* **the queue grows through the run**: requests arriving in the last tenth
  wait at least twice as long for their first token as those of the second
  tenth (the first is skipped: it starts from an empty fleet), and at least
  1 s longer (or the TTFT limit of the SLO, when smaller) — the fleet is
  offered more than it serves;
* **the drain tail dominates**: the time from the last arrival to the last
  token is longer than the arrival window itself;
* **attainment collapses in the last windows**: the last tenth's attainment
  is more than 20 points below the run's.

A run past capacity (150% load) shows all three; its means and
percentiles depend on how long it ran, so the report says so rather than
let them be read as the fleet's.
"""

from __future__ import annotations

from typing import Mapping, TypedDict

from llmlb_bench.metrics.counts import CELLS
from llmlb_bench.metrics.run_figures import SteadyFigures, SteadyPart
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.sql import exact_total, quote
from llmlb_bench.store.views import Catalog

PARTS = 10
GROWTH_RATIO, GROWTH_MIN_S = 2.0, 1.0
COLLAPSE = 0.20


class SteadyInputs(TypedDict):
    """What :func:`steady_state` reads of one run (the summary's figures)."""

    window_s: float             # arrival window
    tail_s: float | None        # last end - last scheduled time
    attainment: float | None    # over the run; None without an SLO


def part_sql(cat: Catalog) -> str:
    """SQL: the tenth of its run's arrival window a request arrived in (0 to 9: from the run's first to
    its last scheduled time, by ``scheduled_s``), null for a run without scheduled times. The counts'
    scan groups its cells by it (:func:`llmlb_bench.metrics.counts.cells`), so the tenths cost no scan
    of their own.

    Each run's first time and span are written as the shortest literals that read back as them, which
    DuckDB types DECIMAL and casts to DOUBLE in the arithmetic; they are cast once here, in one row per
    run, and the expression carries the resulting doubles exactly, so a request's tenth is what the
    literals give, to the bit."""
    spans = {r["run_id"]: (r["t0"], max(r["t1"] - r["t0"], 1e-9)) for r in cat.rows(
        "SELECT run_id, min(scheduled_s) AS t0, max(scheduled_s) AS t1 FROM requests GROUP BY ALL ORDER BY run_id")
        if r["t0"] is not None and r["t1"] is not None}
    if not spans:
        return "NULL::INTEGER"
    values = ", ".join(f"({quote(r)}, {a!r}, {b!r})" for r, (a, b) in spans.items())
    typed = cat.rows(f"SELECT run_id, t0::DOUBLE AS t0, span::DOUBLE AS span FROM (VALUES {values}) b(run_id, t0, span)")
    t0, span = ("CASE run_id " + " ".join(f"WHEN {quote(r['run_id'])} THEN '{r[k]!r}'::DOUBLE" for r in typed)
                + " END" for k in ("t0", "span"))
    return f"least(floor((scheduled_s - {t0}) / {span} * {PARTS}), {PARTS - 1})::INTEGER"


#: per run and tenth: the mean TTFT of its ok requests (exact: :func:`llmlb_bench.metrics.sql.exact_total`), its good
#: requests and the requests judged (good not null), and its requests, from the counts' cells
_PARTS_SQL = f"""
SELECT run_id, part, {exact_total('ttft')} / sum(ttft_n)::BIGINT AS ttft_mean, sum(n) FILTER (WHERE good)::BIGINT AS good,
       sum(n) FILTER (WHERE good IS NOT NULL)::BIGINT AS judged, sum(n)::BIGINT AS n
FROM {CELLS} WHERE part IS NOT NULL GROUP BY ALL
"""


def steady_state(cat: Catalog, runs: Mapping[str, SteadyInputs], slo: Slo | None) -> dict[str, SteadyFigures]:
    """run id -> ``{flags: [sentences], parts: [{part, ttft_mean, attainment, n}], tail_s, window_s}``, from
    the counts' cells (:func:`llmlb_bench.metrics.counts.cells`, cut by :func:`part_sql`)."""
    parts: dict[str, list[SteadyPart]] = {}
    for row in cat.rows(_PARTS_SQL):
        # good / judged as avg() of the good flag over the tenth gives it (both exact below 2^53)
        parts.setdefault(row["run_id"], []).append(
            {"part": row["part"], "ttft_mean": row["ttft_mean"],
             "attainment": (row["good"] or 0) / row["judged"] if row["judged"] else None, "n": row["n"]})
    limit = min(slo.limits_for(None).get("ttft", GROWTH_MIN_S), GROWTH_MIN_S) if slo else GROWTH_MIN_S
    out: dict[str, SteadyFigures] = {}
    for run_id, r in runs.items():
        p = {x["part"]: x for x in parts.get(run_id, [])}
        flags: list[str] = []
        second, last = p.get(1), p.get(PARTS - 1)
        early, late = second["ttft_mean"] if second else None, last["ttft_mean"] if last else None
        if len(p) >= PARTS and early is not None and late is not None and late >= GROWTH_RATIO * early \
                and late - early >= limit:
            flags.append(f"the queue grows through the run (mean TTFT {early:,.2f} s for requests arriving in the "
                         f"second tenth, {late:,.2f} s in the last): offered more than it serves")
        window, tail = r.get("window_s"), r.get("tail_s")
        if window and tail is not None and tail > window:
            flags.append(f"the drain tail ({tail:,.1f} s after the last arrival) is longer than the arrival "
                         f"window ({window:,.1f} s)")
        last_att, att = last["attainment"] if last else None, r.get("attainment")
        if last_att is not None and att is not None and last_att < att - COLLAPSE:
            flags.append(f"attainment collapses in the last tenth of arrivals ({100 * last_att:.0f}% against "
                         f"{100 * att:.0f}% over the run)")
        out[run_id] = {"steady": not flags, "flags": flags, "tail_s": tail, "parts": [p[k] for k in sorted(p)]}
    return out
