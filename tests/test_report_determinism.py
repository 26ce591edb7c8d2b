"""Same run, same report bytes: however many threads DuckDB uses, and from one report to the next.

DuckDB adds the rows of a ``sum``/``avg`` over DOUBLE in the order its threads hand them over, so
such figures (attributed energy, per-tenth TTFT means, mean session completion, KV utilisation)
moved in their last digits between two reports of one run. The report's float sums are exact
(:func:`llmlb_bench.metrics.sql.exact_sum`); this test reports a run spread over many Parquet parts
(one scan task each) at 1 thread and at several, twice, and compares the JSON byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import json
import math

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.sql import exact_avg, exact_sum
from llmlb_bench.report.document import ReportOptions, build, to_json
from llmlb_bench.report.figdata import figure_data
from llmlb_bench.schema import TOKEN_SEGMENT
from llmlb_bench.store import RunStore
from llmlb_bench.store.views import Catalog

PART = 1000


def _token_times(first: np.ndarray, gap: np.ndarray, out: np.ndarray) -> pa.Array:
    """The first token, then the rest spaced ``gap``: two segments per request."""
    m = len(first)
    seg = pa.StructArray.from_arrays(
        [pa.array(np.r_[first, first + gap]), pa.array(np.r_[np.zeros(m), gap]),
         pa.array(np.r_[np.ones(m, np.int32), (out - 1).astype(np.int32)])], fields=list(TOKEN_SEGMENT))
    order = np.stack([np.arange(m), np.arange(m) + m], 1).ravel()
    return pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * m + 1, 2, dtype=np.int32)), seg.take(pa.array(order)))


def _write_run(root: Path, n: int = 12 * PART) -> None:
    """Two tenants, sessions, per-request energy and a power series, in parts of PART rows."""
    rng = np.random.default_rng(0)
    config = {"offered_rate": 100.0, "policy": {"name": "p"},
              "cluster": {"pools": [{"name": "default", "replicas": 4, "tp": 1, "gpu": "h100-sxm"}]}}
    with RunStore(root, config=config, backend="sim", label="r", run_id="r", rows_per_group=PART) as run:
        for a in range(0, n, PART):
            sent = a / 100.0 + np.sort(rng.uniform(0, 15, PART))
            ttft, gap = rng.lognormal(np.log(0.08), 0.7, PART), rng.lognormal(np.log(0.02), 0.3, PART)
            out = rng.integers(2, 300, PART)
            first = sent + ttft
            run.requests.write({
                "request_id": np.arange(a, a + PART), "tenant": np.where(rng.random(PART) < 0.6, "a", "b").tolist(),
                "target": [f"r{i % 4}" for i in range(a, a + PART)], "scheduled_s": sent, "sent_s": sent,
                "first_token_s": first, "last_token_s": first + gap * (out - 1),
                "token_times": _token_times(first, gap, out),
                "input_tokens": rng.integers(10, 2000, PART).astype(np.int32), "output_tokens": out.astype(np.int32),
                "status": np.where(rng.random(PART) < 0.01, "error", "ok").tolist(),
                "energy_j": rng.uniform(0.1, 300, PART), "session_id": rng.integers(0, n // 5, PART),
                "turn": rng.integers(1, 5, PART).astype(np.int32)})
        ticks = np.arange(0.0, n / 100.0, 0.5)
        k = 4 * len(ticks)
        run.series.write({"t_s": np.repeat(ticks, 4), "target": [f"r{i % 4}" for i in range(k)],
                          "waiting": rng.poisson(2, k), "running": rng.poisson(60, k),
                          "kv_blocks_used": rng.integers(0, 3000, k), "kv_blocks_total": np.full(k, 3000),
                          "power_w": rng.uniform(300, 700, k)})


def _report(root: Path, threads: int) -> str:
    """The report's JSON, then the HTML figures' data (the per-target timelines average series rows)."""
    cat = Catalog([root])
    cat.con.execute(f"SET threads = {threads}")
    doc = build(cat, ReportOptions(slo=Slo.parse("ttft=200ms,tpot=30ms")))
    return to_json(doc) + json.dumps(figure_data(cat, doc)["timelines"])


def test_report_bytes_do_not_depend_on_threads(tmp_path: Path) -> None:
    _write_run(tmp_path)
    one = _report(tmp_path, 1)
    assert '"attributed_energy_j"' in one and '"completion_s"' in one and '"ttft_mean"' in one
    for threads in (4, 4, 7):
        assert _report(tmp_path, threads) == one


def test_exact_sum_is_the_sum_and_keeps_nulls_and_non_finite_values() -> None:
    con = duckdb.connect()
    con.execute("SET threads = 4")
    rng = np.random.default_rng(1)
    x = rng.lognormal(0, 3, 300_000) * np.where(rng.random(300_000) < 0.3, -1, 1)
    con.register("t", pa.table({"x": x, "g": np.arange(len(x)) % 3}))
    got = con.sql(f"SELECT g, {exact_sum('x')} AS s, {exact_avg('x', 'x > 0')} AS m FROM t GROUP BY g "
                  f"ORDER BY g").fetchall()
    for g, s, m in got:
        part = x[np.arange(len(x)) % 3 == g]
        assert s == pytest.approx(math.fsum(part), rel=1e-15)          # exact to 1e-18 per value, rounded once
        assert m == pytest.approx(math.fsum(part[part > 0]) / (part > 0).sum(), rel=1e-15)

    def one(values: str) -> object:
        return con.sql(f"SELECT {exact_sum('x')} FROM (VALUES {values}) v(x)").fetchall()[0][0]

    assert one("(NULL::DOUBLE), (NULL)") is None
    assert one("(1.5::DOUBLE), (NULL), (2.25)") == 3.75
    assert math.isnan(one("(1.5::DOUBLE), ('nan')"))                           # type: ignore[arg-type]
    assert one("(1.5::DOUBLE), ('inf')") == math.inf
    assert math.isnan(one("('-inf'::DOUBLE), ('inf'), (1.0)"))                  # type: ignore[arg-type]
    assert one("(1.5::DOUBLE), (1e300)") == 1e300                             # too large for a decimal: added apart
