"""Latency samples of every run, SLO class and tenant: one DuckDB scan per run hands the columns to NumPy.

Per run, one query over ``request_metrics`` returns each per-request
figure's value (and weight, for GuideLLM's weighted figures) of its ok
requests, with their SLO class and tenant when the run has several; token
gaps (vLLM's ITL) come from the token table of
:mod:`llmlb_bench.metrics.sample`. Each figure becomes a sorted
:class:`~llmlb_bench.metrics.distribution.Sample`, and every percentile and
bootstrap interval is read from it exactly.

Groups (the per-class and per-tenant tables) get TTFT and E2E at p50 and
p99, under the same definitions as the run's.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

from llmlb_bench.metrics.definitions import Figure
from llmlb_bench.metrics.distribution import sample_of
from llmlb_bench.metrics.sample import TOKENS
from llmlb_bench.metrics.sql import itl_gaps_sql, quote
from llmlb_bench.store.views import Catalog

GROUP_FIGURES = ("ttft", "e2e")
GROUP_PERCENTILES = (50.0, 99.0)

#: ("run", run_id, figure) or (group column, run_id, group, figure)
Key = tuple[str, ...]


def _column(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def _codes(col: str, names: list[str]) -> str:
    """SQL: a group's index in ``names`` (small integers travel to NumPy far cheaper than strings)."""
    return (f"CASE coalesce({col}, 'default') " + " ".join(f"WHEN {quote(g)} THEN {i}" for i, g in enumerate(names))
            + f" END AS g_{col}")


def _run_samples(cat: Catalog, run_id: str, figs: Mapping[str, Figure],
                 groups: Mapping[str, list[str]]) -> dict[Key, Any]:
    per_request = {n: f for n, f in figs.items() if f.value is not None}
    cols = [f"{f.value} AS v_{n}" for n, f in per_request.items()]
    cols += [f"({f.weight})::BIGINT AS w_{n}" for n, f in per_request.items() if f.weight != "1"]
    cols += [_codes(col, names) for col, names in groups.items()]
    table = cat.query(f"SELECT {', '.join(cols)} FROM request_metrics WHERE run_id = {quote(run_id)} "
                      f"AND status = 'ok'")
    codes = {col: _column(table, f"g_{col}") for col in groups}
    out: dict[Key, Any] = {}
    for n, f in per_request.items():
        values = _column(table, f"v_{n}")
        weights = _column(table, f"w_{n}") if f.weight != "1" else None
        s = sample_of(values, weights)
        if s is not None:
            out[("run", run_id, n)] = s
        if n in GROUP_FIGURES:
            for col, names in groups.items():
                for i, name in enumerate(names):
                    g = values[(codes[col] == i) & ~np.isnan(values)]
                    if len(g):
                        out[(col, run_id, name, n)] = g
    if any(f.value is None for f in figs.values()):
        name = next(n for n, f in figs.items() if f.value is None)
        gaps = cat.query(f"SELECT v, w FROM ({itl_gaps_sql(TOKENS)}) WHERE run_id = {quote(run_id)}")
        s = sample_of(_column(gaps, "v"), _column(gaps, "w"))
        if s is not None:
            out[("run", run_id, name)] = s
    return out


def latency_samples(cat: Catalog, figs: Mapping[str, Figure], runs: Iterable[str],
                    groups: Mapping[str, Mapping[str, list[str]]]) -> dict[Key, Any]:
    """Samples of every figure of every run; for the groups in ``groups`` (run -> column -> names), the
    raw values of :data:`GROUP_FIGURES` (only their p50 and p99 are shown, which need no sort).

    Needs the ``request_metrics`` view and the token table
    (:func:`llmlb_bench.metrics.sample.create_token_table`).
    """
    out: dict[Key, Any] = {}
    for run_id in runs:
        out.update(_run_samples(cat, run_id, figs, groups.get(run_id, {})))
    return out


def group_latency(samples: Mapping[Key, Any], figs: Mapping[str, Figure]) -> dict[tuple[str, ...], dict[str, Any]]:
    """``{(column, run_id, group): {ttft_p50, ttft_p99, e2e_p50, e2e_p99}}`` (NumPy's selection, no sort;
    "inverted_cdf" is GuideLLM's rule)."""
    method = {"linear": "linear", "inverse_cdf": "inverted_cdf"}
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for k, values in samples.items():
        if k[0] != "run":
            qs = np.percentile(values, GROUP_PERCENTILES, method=method[figs[k[3]].method])
            out.setdefault(k[:3], {}).update({f"{k[3]}_p{p:g}": float(q) for p, q in zip(GROUP_PERCENTILES, qs)})
    return out
