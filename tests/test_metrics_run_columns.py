"""metrics/run_columns.py: a run's columns read once for the latency samples and the fairness windows give
every figure the stages' own queries give, to the bit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from llmlb_bench.metrics import fairness, run_columns, summary
from llmlb_bench.metrics.columns import Scratch
from llmlb_bench.metrics.definitions import Definitions
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.store import RunStore
from llmlb_bench.store.views import Catalog


def _maybe(rng: np.random.Generator, values: np.ndarray, share: float) -> list[object]:
    """``values`` with a ``share`` of them null."""
    return [None if rng.random() < share else v for v in values.tolist()]


def _write_run(root: Path, run_id: str, rng: np.random.Generator, backend: str, reasoning: bool) -> None:
    """A random run: awkward start times (many digits, far from 0), nulls in every nullable column the
    stages read, NaN times, never-started, never-sent and failed requests, 1-3 tenants, classes and
    adapters (nulls among them), streams over one window or many."""
    n = int(rng.integers(150, 400))
    t0 = float(rng.choice([0.0, 1764712345.1234567, 12.345678901234567, 3e-7])) + float(rng.random())
    sched = t0 + np.sort(rng.exponential(0.05, n).cumsum())
    sent = sched + np.where(rng.random(n) < 0.3, rng.exponential(0.2, n), 0.0)
    first = sent + rng.lognormal(np.log(0.2), 0.8, n)
    out = rng.integers(0, 60, n)
    last = first + out * rng.lognormal(np.log(0.05), 0.5, n) * rng.choice([1.0, 20.0], n, p=[0.8, 0.2])
    status = rng.choice(["ok", "ok", "ok", "ok", "error", "timeout", "not_sent"], n)
    never = (rng.random(n) < 0.1) | (status == "not_sent")
    first_l, last_l = _maybe(rng, first, 0.05), _maybe(rng, last, 0.05)
    for i in np.flatnonzero(never):
        first_l[i] = last_l[i] = None
    for i in np.flatnonzero(rng.random(n) < 0.03):
        first_l[i] = math.nan
    sent_l = _maybe(rng, sent, 0.05)
    for i in np.flatnonzero(status == "not_sent"):
        sent_l[i] = None
    tenants = ["chat", "batch", "agent"][:int(rng.integers(1, 4))]
    classes = ["interactive", "batch", "bulk"][:int(rng.integers(1, 4))]
    adapters = ["lora-a", "lora-b"][:int(rng.integers(0, 3))]
    rows: dict[str, object] = {
        "request_id": np.arange(n), "scheduled_s": sched, "sent_s": sent_l, "first_token_s": first_l,
        "last_token_s": last_l, "input_tokens": _maybe(rng, rng.integers(1, 500, n), 0.05),
        "output_tokens": _maybe(rng, out, 0.05), "status": status.tolist(),
        "tenant": _maybe(rng, rng.choice(tenants, n), 0.1),
        "slo_class": _maybe(rng, rng.choice(classes, n), 0.1),
        "adapter": _maybe(rng, rng.choice(adapters, n), 0.3) if adapters else [None] * n,
    }
    if reasoning:
        rows["reasoning_tokens"] = np.minimum(out, rng.integers(0, 10, n))
        rows["first_answer_s"] = first + 0.01
    with RunStore(root, config={"policy": {"name": run_id}}, backend=backend, label=run_id, run_id=run_id) as run:
        run.requests.write(rows)


def _figures(root: Path, definitions: Definitions, window_s: float) -> str:
    figs = summary.summarize(Catalog([root]), Slo.parse("ttft=300ms,tpot=60ms;batch:e2e=30s"),
                             summary.Options(definitions=definitions, window_s=window_s, ci=True))
    return json.dumps(figs, sort_keys=True, default=str)


@pytest.mark.parametrize("seed", range(12))
def test_figures_from_columns_read_once_are_the_queries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        seed: int) -> None:
    """Every figure of every run (latency samples and their intervals, groups, the wait, fairness windows)
    the same from the columns read once as from the stages' own queries, over random runs: both origins
    (a simulated run counts from arrival, a replayed one from sending), both definitions (GuideLLM's
    weighted figures), a run with reasoning (its own queries), windows of 0.5 to 10 s."""
    rng = np.random.default_rng(seed)
    for i in range(3):
        _write_run(tmp_path, f"run{i}", rng, backend=["sim", "replay", "test"][(seed + i) % 3],
                   reasoning=i == 2 and seed % 3 == 0)
    definitions = [Definitions.vllm, Definitions.guidellm][seed % 2]
    window_s = float(rng.choice([0.5, 2.0, 10.0]))
    once = _figures(tmp_path, definitions, window_s)
    monkeypatch.setattr(summary, "serves", lambda figs: False)
    assert once == _figures(tmp_path, definitions, window_s)


def test_a_value_is_the_views_to_the_bit(tmp_path: Path) -> None:
    """Each value the module computes against the ``request_metrics`` view's SQL, row by row."""
    rng = np.random.default_rng(7)
    _write_run(tmp_path, "r", rng, backend="replay", reasoning=False)
    cat = Catalog([tmp_path])
    cat.con.execute(summary.request_metrics_sql([]))
    rows = cat.query("SELECT count(*) AS n FROM requests").column("n")[0].as_py()
    cols = run_columns.read_run(cat, "r", rows, False, None, np.int64, Scratch())
    for value in run_columns.VALUES:
        want = cat.query(f"SELECT coalesce({value}::DOUBLE, 'NaN') AS v FROM request_metrics "
                         f"WHERE status = 'ok'").column("v").to_numpy()
        got = run_columns.values(cols, value, Scratch(), "v")
        assert np.array_equal(got, want, equal_nan=True) and np.array_equal(got.view(np.int64)[~np.isnan(got)],
                                                                              want.view(np.int64)[~np.isnan(want)])


@pytest.mark.parametrize("t0", [0.1, 1764712345.1234567, 12.345678901234567, 98765.43210987654, 3e-7, -0.3])
def test_the_literal_as_duckdb_subtracts_it(tmp_path: Path, t0: float) -> None:
    """``duckdb_double``: a column less the literal, in DuckDB, is the column less that double, in NumPy."""
    cat = Catalog([tmp_path])
    x = np.random.default_rng(1).random(1000) * 1e4 + t0
    cat.con.register("xs", __import__("pyarrow").table({"x": x}))
    want = cat.query(f"SELECT x - {t0!r} AS d FROM xs").column("d").to_numpy()
    assert np.array_equal(x - run_columns.duckdb_double(cat, t0), want)


def _walk_before(svc: np.ndarray, many: np.ndarray, f: np.ndarray, l: np.ndarray, n_out: np.ndarray,
                 jf: np.ndarray, jl: np.ndarray, tn: np.ndarray, nwin: int, w: float) -> None:
    """The multi-window walk as it was, over all the rows at once: the reference for :func:`fairness._walk`."""
    cells = len(svc)
    rows = np.flatnonzero(many)
    ff, nn, j, jend, tt = f[rows], n_out[rows], jf[rows], jl[rows], tn[rows]
    g = (l[rows] - ff) / (nn - 1)
    starts = np.ceil((j * w - ff) / g)
    while len(j):
        ends = np.ceil(((j + 1) * w - ff) / g)
        k_hi = np.minimum(nn - 1, ends - 1)
        k_hi -= np.maximum(0, starts)
        k_hi += 1
        svc += np.bincount(tt * nwin + j, weights=fairness.OUTPUT_WEIGHT * np.maximum(0, k_hi), minlength=cells)
        more = j < jend
        starts = ends
        if not more.all():
            ff, nn, g, j, jend, tt, starts = ff[more], nn[more], g[more], j[more], jend[more], tt[more], starts[more]
        j += 1


@pytest.mark.parametrize("seed, block", [(0, 7), (1, 64), (2, 1 << 18), (3, 1)])
def test_the_walk_in_blocks_is_the_walk_over_every_row(monkeypatch: pytest.MonkeyPatch, seed: int,
                                                       block: int) -> None:
    """Streams over 2 to 40 windows, some of one token (a zero spacing), some with NaN times, several
    tenants, blocks of a few rows or all of them: the same service in every cell, to the bit."""
    rng = np.random.default_rng(seed)
    n, tenants, w = 3000, 3, float(rng.choice([0.5, 1.0, 10.0]))
    f = rng.random(n) * 50 * w
    l = f + rng.exponential(3 * w, n) * rng.choice([0.0, 1.0, 5.0], n, p=[0.05, 0.8, 0.15])
    n_out = rng.integers(1, 300, n).astype(np.float64)
    f[rng.random(n) < 0.001] = np.nan
    l[rng.random(n) < 0.001] = np.nan
    x = np.nan_to_num(f / w)
    jf = np.floor(x).astype(np.int64)
    jl = np.floor(np.nan_to_num(l / w)).astype(np.int64)
    many = (jl > jf) & (n_out > 0)
    tn = rng.integers(0, tenants, n)
    nwin = int(max(np.nanmax(f), np.nanmax(l)) // w) + 1
    want = np.zeros(tenants * nwin)
    with np.errstate(all="ignore"):
        _walk_before(want, many, f, l, n_out, jf, jl, tn, nwin, w)
        monkeypatch.setattr(fairness, "WALK_ROWS", block)
        got = np.zeros(tenants * nwin)
        fairness._walk(got, many, f, l, n_out, jf, jl, tn, nwin, w, Scratch())
    assert np.array_equal(got, want, equal_nan=True) and np.isfinite(want).sum() > len(want) // 2 and np.nansum(want) > 0


@pytest.mark.parametrize("share", [0.0, 0.01, 0.5, 1.0])
def test_the_ok_rows_indices_a_block_at_a_time(monkeypatch: pytest.MonkeyPatch, share: float) -> None:
    monkeypatch.setattr(run_columns, "BLOCK_ROWS", 37)
    ok = np.random.default_rng(3).random(1000) >= share
    got = run_columns._indices(ok, int(ok.sum()), Scratch())
    assert np.array_equal(got, np.flatnonzero(ok))
