"""metrics/latency.py: the group columns' rows, from one ordering of the rows' cells."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench.metrics.columns import Scratch
from llmlb_bench.metrics.counts import GROUP_NULL
from llmlb_bench.metrics.latency import _by_group, _cell_dtype, _cells
from llmlb_bench.store.views import Catalog


@pytest.mark.parametrize("seed, sizes", [(0, {"slo_class": 2, "tenant": 3}),
                                         (1, {"slo_class": 3, "tenant": 2, "adapter": 4}),
                                         (2, {"tenant": 5}), (3, {"slo_class": 2, "tenant": 300, "adapter": 200})])
def test_each_columns_groups_hold_exactly_its_rows(tmp_path: Path, seed: int, sizes: dict[str, int]) -> None:
    """Random rows (nulls read as the default group, some cells empty, one set of columns with more
    cells than two bytes hold) through the SQL of the cells and their one ordering: every column's
    group holds the rows of that group, each once."""
    rng = np.random.default_rng(seed)
    n = 2000
    names = {col: [f"{col[0]}{i}" for i in range(k - 1)] + [GROUP_NULL[col]] for col, k in sizes.items()}
    # the last group is the null one; a column's first group left empty where it has three or more
    picks = {col: rng.integers(1 if len(g) > 2 else 0, len(g), n) for col, g in names.items()}
    rows = pa.table({col: pa.array([None if i == len(names[col]) - 1 else names[col][i] for i in picks[col]],
                                   pa.string()) for col in names})
    cat = Catalog([tmp_path])
    cat.con.register("rows", rows)
    cell = np.asarray(cat.query(f"SELECT {_cells(names)} FROM rows").column("cell").to_numpy())
    cells = int(np.prod(list(sizes.values())))
    cell = cell.astype(_cell_dtype(cells))
    grouped = _by_group(cell, list(sizes.values()), Scratch())
    for (col, groups), (order, bounds) in zip(names.items(), grouped):
        assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == len(groups) + 1
        for i in range(len(groups)):
            got = np.sort(order[bounds[i]:bounds[i + 1]])
            assert np.array_equal(got, np.flatnonzero(picks[col] == i)), (col, groups[i])


@pytest.mark.parametrize("method", ["linear", "inverted_cdf"])
def test_group_percentiles_are_numpys_to_the_bit(method: str) -> None:
    """p50 and p99 by selection (unsorted values) and read off sorted ones, both without NumPy's
    partition: np.percentile's values, bit for bit, on sizes 1 to 400 and a few large ones, with ties,
    zeros of both signs and negative values."""
    from llmlb_bench.metrics.latency import GROUP_PERCENTILES, _percentiles

    rng = np.random.default_rng(5)
    sizes = [*range(1, 401), 5000, 65537, 1_000_003]
    for n in sizes:
        kind = n % 4
        v = (rng.lognormal(0, 2, n) if kind == 0 else rng.integers(-3, 4, n).astype(float) if kind == 1
             else rng.normal(0, 1e-3, n) if kind == 2 else np.r_[rng.random(n - 1), -0.0][:n])
        ordered = np.sort(v)
        want = np.percentile(ordered.copy(), GROUP_PERCENTILES, method=method)
        for values, is_sorted in ((ordered.copy(), True), (v.copy(), False)):
            got = np.array(_percentiles(values, method, is_sorted))  # type: ignore[arg-type]
            assert np.array_equal(got.view(np.int64), want.view(np.int64)), (n, is_sorted, got, want)


@pytest.mark.parametrize("tenants", [["a", "b", "c"], ["c", "a", "b"]])
def test_each_rows_group_index_is_its_digit_in_the_names_order(tenants: list[str]) -> None:
    """``group_index``: a row's tenant, from its cell number (classes x tenants x adapters in mixed
    radix), as its index in the sorted names: computed directly where the cells number the tenants in
    that order, looked up where they do not."""
    from llmlb_bench.metrics.latency import group_index

    groups = {"slo_class": ["x", "y"], "tenant": tenants, "adapter": ["base", "l1"]}
    rng = np.random.default_rng(3)
    cls, ten, ad = rng.integers(0, 2, 1000), rng.integers(0, 3, 1000), rng.integers(0, 2, 1000)
    cell = (cls * 6 + ten * 2 + ad).astype(np.uint16)
    names = sorted(tenants)
    got = group_index(groups, "tenant", cell, names, np.empty(1000, dtype=np.int64))
    assert got.dtype == np.int64 and got.tolist() == [names.index(tenants[t]) for t in ten]
