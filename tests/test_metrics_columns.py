"""metrics/columns.py: a query's columns read batch by batch into NumPy, into reused memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmlb_bench.metrics import columns
from llmlb_bench.metrics.columns import Scratch, read
from llmlb_bench.store.views import Catalog

SQL = "SELECT i::BIGINT AS i, i * 0.5 AS x, (i % 3)::INTEGER AS g FROM range({n}) t(i) ORDER BY i"
DTYPES = {"i": np.int64, "x": np.float64, "g": np.uint16}


@pytest.fixture
def cat(tmp_path: Path) -> Catalog:
    return Catalog([tmp_path])


@pytest.mark.parametrize("expected", [1000, 10, 0, 5000])
def test_every_row_in_order_across_batches_whatever_the_count_expected(cat: Catalog, monkeypatch: pytest.MonkeyPatch,
                                                                       expected: int) -> None:
    """Many batches (the batch size made small), and a row count guessed right, too low (the arrays
    grow) or too high (they are cut to the rows read)."""
    monkeypatch.setattr(columns, "BATCH_ROWS", 64)
    got = read(cat, SQL.format(n=1000), expected, DTYPES)
    assert {k: v.dtype for k, v in got.items()} == {k: np.dtype(t) for k, t in DTYPES.items()}
    assert np.array_equal(got["i"], np.arange(1000))
    assert np.array_equal(got["x"], np.arange(1000) * 0.5)
    assert np.array_equal(got["g"], np.arange(1000) % 3)


def test_scratch_memory_is_reused_and_kept_columns_are_not(cat: Catalog) -> None:
    scratch = Scratch()
    first = read(cat, SQL.format(n=500), 500, DTYPES, scratch, keep=["x"])
    kept = first["x"]
    second = read(cat, SQL.format(n=400), 400, DTYPES, scratch, keep=["x"])
    assert np.shares_memory(first["i"], second["i"]) and np.shares_memory(first["g"], second["g"])
    assert not np.shares_memory(kept, second["x"])
    assert np.array_equal(kept, np.arange(500) * 0.5)     # a kept column is the caller's
    assert np.array_equal(second["i"], np.arange(400))


def test_scratch_grows_and_changes_dtype_on_demand() -> None:
    scratch = Scratch()
    a = scratch.array("a", 10, np.float64)
    assert scratch.array("a", 5, np.float64).base is a.base
    bigger = scratch.array("a", 20, np.float64)
    assert len(bigger) == 20 and not np.shares_memory(a, bigger)
    assert scratch.array("a", 20, np.int64).dtype == np.int64
