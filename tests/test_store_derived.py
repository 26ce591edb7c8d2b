"""The ``deliveries`` column the store derives from ``token_times``, and tokens per delivery read from it
or, in files written before it, from the token lists."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.metrics.counts import cells, rollup
from llmlb_bench.metrics.speculative import speculative
from llmlb_bench.metrics.sql import request_metrics_sql
from llmlb_bench.schema import REQUESTS, TOKEN_SEGMENT
from llmlb_bench.store import RunStore
from llmlb_bench.store.derived import deliveries
from llmlb_bench.store.parts import table_files
from llmlb_bench.store.views import Catalog
from metrics_helpers import store_run

#: the documented definition (docs/metrics.md, "Speculative decoding"), per row, in DuckDB
_PER_ROW_SQL = ("SELECT coalesce(list_sum(list_transform(token_times, lambda s: CASE WHEN s.gap_s = 0 THEN 1 "
                "ELSE s.count END)), 0)::BIGINT AS d FROM t")


def _lists(rng: np.random.Generator, n: int, null_fields: bool = True) -> pa.Array:
    """Random token lists: null and empty lists, bundles (gap 0), spaced runs, null fields (a gap or a
    count: no writer leaves one null, the definition still says what they count)."""
    rows: list[list[dict[str, float | int | None]] | None] = []
    for _ in range(n):
        k = int(rng.integers(0, 6))
        if rng.random() < 0.1:
            rows.append(None)
            continue
        rows.append([{"start_s": float(i), "gap_s": None if null_fields and rng.random() < 0.05 else
                      float(rng.choice([0.0, 0.02])),
                      "count": None if null_fields and rng.random() < 0.05 else int(rng.integers(1, 50))}
                     for i in range(k)])
    return pa.array(rows, pa.list_(TOKEN_SEGMENT))


def test_deliveries_equal_the_documented_list_sql_row_by_row():
    rng = np.random.default_rng(7)
    lists = _lists(rng, 2000)
    t = pa.table({"token_times": lists})   # noqa: F841  (read by DuckDB by name)
    want = duckdb.sql(_PER_ROW_SQL).fetchnumpy()["d"]
    got = deliveries(pa.chunked_array([lists.slice(0, 700), lists.slice(700)])).to_numpy()
    assert got.tolist() == want.tolist()
    assert (got == 0).sum() > 100 and got.max() > 50      # the case has empty rows and long ones


def _drop_deliveries(part: Path) -> None:
    """Rewrite a part file as a writer before the column did: the column absent."""
    pq.write_table(pq.read_table(part).drop(["deliveries"]), part)


def test_tokens_per_delivery_is_the_same_from_the_column_and_from_the_lists(tmp_path: Path):
    """Three copies of one run: with the column, without it (written before it), and half of each (two parts)."""
    rng = np.random.default_rng(3)
    n = 300
    lists = _lists(rng, n, null_fields=False)
    status = np.where(rng.random(n) < 0.9, "ok", "error")
    cols = {"request_id": np.arange(n), "token_times": lists, "status": status,
            "output_tokens": rng.integers(1, 200, n), "sent_s": np.zeros(n)}
    for name in ("new", "old"):
        store_run(tmp_path, name, cols)
    with RunStore(tmp_path, config={}, backend="test", label="mixed", run_id="mixed") as run:
        run.requests.write({k: v[:120] for k, v in cols.items()})
        run.requests.flush()
        run.requests.write({k: v[120:] for k, v in cols.items()})
    written = pq.read_table(table_files(tmp_path / "new" / "requests.parquet")[0])
    assert written.schema.names == REQUESTS.schema.names and written.column("deliveries").null_count == 0
    _drop_deliveries(table_files(tmp_path / "old" / "requests.parquet")[0])
    mixed = table_files(tmp_path / "mixed" / "requests.parquet")
    assert len(mixed) == 2
    _drop_deliveries(mixed[0])
    # the documented definition: output tokens / deliveries over the ok rows with token times
    ok = pa.array(status == "ok")
    t = pa.table({"token_times": lists.filter(ok)})   # noqa: F841  (read by DuckDB by name)
    per_row = duckdb.sql(_PER_ROW_SQL).fetchnumpy()["d"]
    has = np.array([x is not None and len(x) > 0 for x in lists.filter(ok).to_pylist()])
    want = cols["output_tokens"][status == "ok"][has].sum() / per_row[has].sum()
    cat = Catalog([tmp_path])
    cat.con.execute(request_metrics_sql())
    got = speculative(cat, {u[1]: c for u, c in rollup(cells(cat, None), None).items() if u[0] == "run"})
    assert set(got) == {"new", "old", "mixed"}
    assert got["new"]["tokens_per_delivery"] == got["old"]["tokens_per_delivery"] == \
        got["mixed"]["tokens_per_delivery"] == want
