"""Latency distributions of every run, and of every SLO class and tenant, with few scans.

Unweighted per-request figures (TTFT, E2E, normalized latency, vLLM's TPOT)
have their histograms (DuckDB's ``histogram`` aggregate) computed in the
same scan as the run's counts, and one more scan fetches the rows of the
buckets the percentiles need
(:mod:`llmlb_bench.metrics.distribution`). Weighted figures (GuideLLM's
TPOT and ITL) and token gaps (vLLM's ITL, from ``token_times``,
block-sampled on very large runs: :mod:`llmlb_bench.metrics.sample`) take
two scans of their own.

Per-group figures (the per-class and per-tenant tables) are TTFT and E2E at
p50 and p99 by DuckDB's exact ``quantile_cont`` (linear) or
``quantile_disc`` (GuideLLM's inverse CDF), computed with the per-group
counts, for runs with several groups only.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from llmlb_bench.metrics.definitions import Figure
from llmlb_bench.metrics.distribution import (PERCENTILES, Band, Histogram, bands_of, bucket_sql, in_ranges,
                                              ranges_sql)
from llmlb_bench.metrics.sample import runs_filter
from llmlb_bench.metrics.sql import itl_gaps_sql, quote
from llmlb_bench.store.views import Catalog

GROUP_FIGURES = ("ttft", "e2e")
GROUP_PERCENTILES = (50.0, 99.0)

#: ("run", run_id, figure)
Key = tuple[str, str, str]


def _fast(figs: Mapping[str, Figure]) -> dict[str, Figure]:
    """Figures whose histograms share one scan: one value per request, weight 1."""
    return {n: f for n, f in figs.items() if f.value is not None and f.weight == "1"}


def histogram_columns(figs: Mapping[str, Figure]) -> str:
    """Aggregates for the run-level counts query: a histogram and a sum per fast figure (ok requests)."""
    return ", ".join(f"histogram(CASE WHEN status = 'ok' THEN {bucket_sql(f.value)} END) AS h_{n}, "
                     f"fsum(CASE WHEN status = 'ok' THEN {f.value} END) AS s_{n}" for n, f in _fast(figs).items())


def _histograms(table: pa.Table, fast: Mapping[str, Figure]) -> dict[Key, Histogram]:
    """Histograms from the run-level counts query's ``h_*`` and ``s_*`` columns."""
    runs = table.column("run_id").to_pylist()
    out: dict[Key, Histogram] = {}
    for name in fast:
        maps = table.column(f"h_{name}").combine_chunks()
        sums = table.column(f"s_{name}").to_pylist()
        offsets = maps.offsets.to_numpy()
        keys, counts = maps.keys.to_numpy(zero_copy_only=False), maps.items.to_numpy(zero_copy_only=False)
        for i, run in enumerate(runs):
            if offsets[i] == offsets[i + 1]:
                continue
            b, w = keys[offsets[i]:offsets[i + 1]].astype(np.int64), counts[offsets[i]:offsets[i + 1]].astype(np.int64)
            order = np.argsort(b)
            out[("run", run, name)] = Histogram(b=b[order], w=w[order], vw=float(sums[i]))
    return out


def _fetch_bands(cat: Catalog, hists: Mapping[Key, Histogram], fast: Mapping[str, Figure],
                 percentiles: tuple[float, ...]) -> dict[Key, Band]:
    """One scan for the band rows of every (run, figure)."""
    names = list(fast)
    need = {k: h.ranges(percentiles) for k, h in hists.items()}
    by_run: dict[str, list[str]] = {}
    for k, rng in need.items():
        by_run.setdefault(k[1], []).append(ranges_sql(fast[k[2]].value, rng))
    cols_sql = ", ".join(f"{f.value} AS v{i}, {bucket_sql(f.value)} AS b{i}" for i, f in enumerate(fast.values()))
    cases = " ".join(f"WHEN {quote(run)} THEN ({' OR '.join(conds)})" for run, conds in by_run.items())
    fetched = cat.query(f"SELECT run_id, {cols_sql} FROM request_metrics "
                        f"WHERE status = 'ok' AND CASE run_id {cases} ELSE FALSE END")
    cols = {c: fetched.column(c).to_numpy(zero_copy_only=False) for c in fetched.column_names}
    out: dict[Key, Band] = {}
    for k, h in hists.items():
        i = names.index(k[2])
        mask = (cols["run_id"] == k[1]) & in_ranges(cols[f"b{i}"], need[k])
        out[k] = h.band(cols[f"v{i}"][mask].astype(float), np.ones(int(mask.sum()), dtype=np.int64),
                        cols[f"b{i}"][mask].astype(np.int64))
    return out


def group_quantile_columns(figs: Mapping[str, Figure]) -> str:
    """Aggregates for the per-group counts query: exact TTFT and E2E p50/p99 of ok requests."""
    agg = {"linear": "quantile_cont", "inverse_cdf": "quantile_disc"}
    qs = "[" + ", ".join(repr(p / 100) for p in GROUP_PERCENTILES) + "]"
    return ", ".join(f"{agg[figs[n].method]}(CASE WHEN status = 'ok' THEN {figs[n].value} END, {qs}) AS q_{n}"
                     for n in GROUP_FIGURES)


def group_latency(row: Mapping[str, Any]) -> dict[str, Any]:
    """``{ttft_p50, ttft_p99, e2e_p50, e2e_p99}`` from a per-group row with :func:`group_quantile_columns`."""
    return {f"{n}_p{p:g}": (row[f"q_{n}"] or [None] * len(GROUP_PERCENTILES))[i]
            for n in GROUP_FIGURES for i, p in enumerate(GROUP_PERCENTILES)}


def latency_bands(cat: Catalog, figs: Mapping[str, Figure], counts: pa.Table,
                  token_runs: Mapping[str, tuple[int, int, int]], token_sample: int,
                  percentiles: tuple[float, ...] = PERCENTILES) -> dict[Key, Band]:
    """Bands of every figure of every run (needs the ``request_metrics`` view).

    ``counts`` is the run-level counts query with :func:`histogram_columns`;
    ``token_runs`` maps run ids to (ok requests, first and last request id),
    for the block sample of token gaps.
    """
    fast = _fast(figs)
    hists = _histograms(counts, fast) if fast else {}
    out = _fetch_bands(cat, hists, fast, percentiles) if hists else {}
    for name, f in figs.items():
        if name in fast:
            continue
        if f.value is None:
            source = f"SELECT run_id AS key, v, w FROM ({itl_gaps_sql(runs_filter(token_runs, token_sample))})"
        else:
            source = (f"SELECT run_id AS key, {f.value} AS v, ({f.weight})::BIGINT AS w FROM request_metrics "
                      f"WHERE status = 'ok'")
        out.update({("run", run, name): band for run, band in bands_of(cat.query, source, percentiles).items()})
    return out
