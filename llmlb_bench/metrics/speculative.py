"""Speculative decoding: how much the target accepted, and how tokens were delivered.

Per run, from the counts of verify steps that drafted (``drafts``), tokens
drafted and drafts accepted, as vLLM V1 counts them
(``vllm:spec_decode_num_drafts`` / ``_num_draft_tokens`` /
``_num_accepted_tokens``):

* acceptance rate = accepted / drafted tokens;
* mean acceptance length = 1 + accepted / drafts: tokens per verify step,
  the target's own token included (vLLM's "mean acceptance length").

The counts come from the server's counters (a replay: the ``spec_*``
columns of series, per-scrape increases) or else from the simulator's
per-request ``spec_*`` columns. Runs with neither have no such figures.

Tokens per delivery = output tokens / deliveries of ok requests, a delivery
being the tokens that arrive at one instant: one per ``token_times``
segment of gap 0 (a stream chunk, a bundled verify step), ``count`` per
segment of spaced tokens. It is 1 for plain decoding streamed token by
token and the mean tokens per chunk when tokens arrive bundled. Each row's
deliveries are the ``deliveries`` column the store derives as rows are written
(:mod:`llmlb_bench.store.derived`), so the report decodes no token list; rows of
files written before the column are counted from their lists, as the SQL in
docs/metrics.md does.
"""

from __future__ import annotations

from typing import Mapping

from llmlb_bench.metrics.counts import Counts
from llmlb_bench.metrics.run_figures import SpeculativeFigures
from llmlb_bench.metrics.sql import quote
from llmlb_bench.store.views import Catalog

#: the rows of files written before the ``deliveries`` column (null there) are counted from their token lists
#: (docs/metrics.md's definition); the counts' scan (:mod:`llmlb_bench.metrics.counts`) sums the column
_LISTS_SQL = """
SELECT run_id, sum(output_tokens)::BIGINT AS tokens,
       sum(list_sum(list_transform(token_times, lambda s: CASE WHEN s.gap_s = 0 THEN 1 ELSE s.count END)))::BIGINT
           AS deliveries
FROM requests WHERE status = 'ok' AND deliveries IS NULL AND len(token_times) > 0 AND run_id IN ({runs}) GROUP BY 1
"""


def _server_counts(cat: Catalog) -> dict[str, tuple[float, float, float]]:
    """``{run_id: (drafts, draft tokens, accepted)}`` from the server's counters in ``series`` (runs with any)."""
    if cat.holds_no_value("series", "spec_draft_tokens"):     # no run's series counts drafts: none to read
        return {}
    rows = cat.rows("SELECT run_id, sum(spec_drafts)::DOUBLE AS d, sum(spec_draft_tokens)::DOUBLE AS t, "
                    "sum(spec_accepted_tokens)::DOUBLE AS a FROM series GROUP BY 1")
    return {r["run_id"]: (r["d"], r["t"], r["a"]) for r in rows if r["t"]}


def _deliveries(cat: Catalog, counts: Mapping[str, Counts]) -> dict[str, tuple[int | None, int]]:
    """``{run_id: (output tokens, deliveries)}`` over the ok rows with token times, for every run
    with such rows: the stored column where rows have it, the token lists where they do not
    (tokens None where no such row counts any)."""
    out = {k: (c["delivered_tokens"], c["deliveries"] or 0) for k, c in counts.items() if c["ok"]}
    older = [k for k, c in counts.items() if c["deliveries_unknown"]]
    if older:
        for r in cat.rows(_LISTS_SQL.format(runs=", ".join(map(quote, older)))):
            tokens, delivered = out[r["run_id"]]
            both = [t for t in (tokens, r["tokens"]) if t is not None]
            out[r["run_id"]] = (sum(both) if both else None, delivered + (r["deliveries"] or 0))
    return {k: v for k, v in out.items() if v[1]}


def speculative(cat: Catalog, counts: Mapping[str, Counts]) -> dict[str, SpeculativeFigures]:
    """``{run_id: {...}}`` for every run with token times; the acceptance figures where counted.
    ``counts``: each run's counts (:func:`llmlb_bench.metrics.counts.rollup`), which sum the
    simulator's per-request ``spec_*`` columns and the ``deliveries`` column over its ok rows."""
    server = _server_counts(cat)
    # the three sums come from the same rows: where draft tokens are counted, so are the other two
    simulated = {k: (float(c["spec_drafts"] or 0), float(c["spec_draft_tokens"] or 0),
                     float(c["spec_accepted_tokens"] or 0)) for k, c in counts.items() if c["spec_draft_tokens"]}
    out: dict[str, SpeculativeFigures] = {}
    for run_id, (tokens, delivered) in sorted(_deliveries(cat, counts).items()):
        fig: SpeculativeFigures = {"tokens_per_delivery": tokens / delivered if tokens is not None else None}
        source = "server" if run_id in server else ("simulator" if run_id in simulated else None)
        if source is not None:
            drafts, drafted, accepted = (server if source == "server" else simulated)[run_id]
            fig.update({"source": source, "drafts": int(drafts), "draft_tokens": int(drafted),
                        "accepted_tokens": int(accepted), "acceptance_rate": accepted / drafted,
                        "mean_acceptance_length": 1 + accepted / drafts if drafts else None})
        out[run_id] = fig
    return out
