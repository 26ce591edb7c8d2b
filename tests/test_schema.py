"""Schema round trips and the one-line errors of file validation."""

from __future__ import annotations


import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import make_trace
from llmlb_bench.errors import UserError
from llmlb_bench.schema import (META_KIND, META_VERSION, REQUESTS, TRACE, read_table, read_trace, trace_block_size,
                                trace_spec, write_trace)


def test_trace_round_trip_keeps_values_and_metadata(tmp_path):
    table = make_trace(5)
    path = tmp_path / "t.parquet"
    write_trace(table, path, spec={"seed": 7, "tenants": ["a"]}, block_size=32)
    back = read_trace(path)
    assert back.schema.remove_metadata() == TRACE.schema
    assert back.column("arrival_s").to_pylist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert back.column("tenant").to_pylist() == ["default"] * 5
    assert trace_spec(back) == {"seed": 7, "tenants": ["a"]}
    assert trace_block_size(back) == 32
    meta = pq.read_schema(path).metadata
    assert meta[META_KIND] == b"trace" and meta[META_VERSION] == b"1"


def test_foreign_trace_with_minimal_columns_and_int64_lengths_is_accepted(tmp_path):
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"request_id": [1, 2], "arrival_s": [0.0, 1.5],
                             "input_tokens": [10, 20], "output_tokens": [5, 6]}), path)
    t = read_trace(path)
    assert t.column("input_tokens").type == pa.int32()
    assert t.column("kind").to_pylist() == ["chat", "chat"]


def test_requests_round_trip_with_token_segments(tmp_path):
    rows = {"run_id": ["r"], "request_id": [1], "status": ["ok"],
            "token_times": [[{"start_s": 0.1, "gap_s": 0.02, "count": 10}]]}
    table = REQUESTS.conform(pa.table(rows), "x")
    pq.write_table(table.replace_schema_metadata(REQUESTS.metadata()), tmp_path / "r.parquet")
    back = read_table(tmp_path / "r.parquet", REQUESTS)
    assert back.column("token_times").to_pylist() == [[{"start_s": 0.1, "gap_s": 0.02, "count": 10}]]


def _expect_error(path, fragment):
    with pytest.raises(UserError) as info:
        read_trace(path)
    line = info.value.line()
    assert str(path) in line and fragment in line and "\n" not in line
    return line


def test_missing_file(tmp_path):
    _expect_error(tmp_path / "nope.parquet", "no such file")


def test_not_parquet(tmp_path):
    p = tmp_path / "t.parquet"
    p.write_text("request_id,arrival_s\n1,0\n")
    _expect_error(p, "not a readable Parquet file")


def test_missing_column(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"request_id": [1], "arrival_s": [0.0], "input_tokens": [3]}), p)
    _expect_error(p, "missing column 'output_tokens'")


def test_wrong_type(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"request_id": [1], "arrival_s": ["soon"], "input_tokens": [3], "output_tokens": [4]}), p)
    _expect_error(p, "column 'arrival_s' has type string")


def test_lossy_cast_is_refused(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"request_id": [1], "arrival_s": [0.0], "input_tokens": [2**40], "output_tokens": [4]}), p)
    _expect_error(p, "column 'input_tokens' cannot be read as int32")


def test_newer_schema_version(tmp_path):
    p = tmp_path / "t.parquet"
    t = make_trace(2).replace_schema_metadata({META_KIND: b"trace", META_VERSION: b"99"})
    pq.write_table(t, p)
    _expect_error(p, "schema version 99 is newer")


def test_wrong_kind(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(REQUESTS.empty().replace_schema_metadata(REQUESTS.metadata()), p)
    _expect_error(p, "is a requests file, expected a trace file")


def test_duplicate_ids_and_negative_arrivals(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"request_id": [1, 1], "arrival_s": [0.0, 1.0], "input_tokens": [1, 1], "output_tokens": [1, 1]}), p)
    _expect_error(p, "duplicate")
    pq.write_table(pa.table({"request_id": [1, 2], "arrival_s": [-1.0, 1.0], "input_tokens": [1, 1], "output_tokens": [1, 1]}), p)
    _expect_error(p, "negative")


def test_write_trace_is_atomic_on_bad_input(tmp_path):
    p = tmp_path / "out.parquet"
    with pytest.raises(UserError):
        write_trace(pa.table({"request_id": [1]}), p)
    assert not p.exists() and not list(tmp_path.iterdir())
