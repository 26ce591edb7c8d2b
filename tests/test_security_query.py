"""``llmlb query`` can read the runs and nothing else, and can write nothing (docs/security.md).

Each probe is a real statement through the real CLI against a real run folder; after all of them the
run's files are byte-for-byte unchanged and no file has appeared anywhere under the results or the
working directory.
"""

from __future__ import annotations

import json

import pytest

from conftest import cli
from llmlb_bench.store import RunStore

PROBES = [
    "EXPLAIN ANALYZE COPY (select 1) TO '{run}/run.json'",
    "EXPLAIN ANALYZE COPY (select * from requests) TO '{run}/leak.csv'",
    "COPY (select 1) TO '{run}/run.json'",
    "EXPLAIN ANALYZE INSTALL httpfs",
    "INSTALL httpfs",
    "LOAD httpfs",
    "EXPLAIN ANALYZE LOAD httpfs",
    "select * from read_text('/proc/self/environ')",
    "select * from read_blob('{run}/run.json')",
    "select * from read_csv('/etc/passwd')",
    "select * from read_parquet('{run}/../*/requests.parquet/*.parquet')",
    "select * from glob('/*')",
    "select * from read_json_auto('{run}/run.json')",
    "ATTACH '{run}/x.duckdb' AS x",
    "EXPLAIN ANALYZE ATTACH '{run}/x.duckdb' AS x",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "RESET enable_external_access",
    "PRAGMA enable_profiling",
    "PRAGMA database_list",
    "CALL pragma_version()",
    "CREATE TABLE t AS SELECT 1",
    "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1",
    "CREATE SECRET (TYPE s3, KEY_ID 'a', SECRET 'b')",
    "EXPORT DATABASE '{run}/export'",
    "EXPLAIN ANALYZE EXPORT DATABASE '{run}/export'",
    "IMPORT DATABASE '{run}'",
    "select 1; COPY (select 1) TO '{run}/y.csv'",
    "DETACH memory",
    "USE system",
    "select * from query('select 1'); drop view requests",
]


@pytest.fixture
def results(tmp_path):
    with RunStore(tmp_path / "res", config={}, backend="sim", run_id="one") as run:
        run.requests.write({"request_id": [0, 1], "status": ["ok", "ok"], "sent_s": [0.0, 1.0]})
    return tmp_path / "res"


def _snapshot(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("probe", PROBES)
def test_probe_fails_with_one_line_and_changes_nothing(probe, results, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LLMLB_TEST_API_KEY", "sk-should-never-show-0123456789")
    before = _snapshot(tmp_path)
    code, out, err = cli(["query", probe.format(run=results / "one"), "-r", str(results)], capsys)
    assert code == 2, (probe, out, err)
    assert err.startswith("error: query:") and err.count("\n") == 1 and "Traceback" not in err
    assert "sk-should-never-show" not in out + err
    assert _snapshot(tmp_path) == before


def test_the_runs_stay_queryable(results, capsys):
    code, out, _ = cli(["query", "select count(*) as n, sum(sent_s) as s from requests", "-r", str(results),
                        "-f", "json"], capsys)
    assert code == 0 and json.loads(out) == [{"n": 2, "s": 1.0}]
    code, out, _ = cli(["query", "explain select * from requests", "-r", str(results), "-f", "json"], capsys)
    assert code == 0 and "plan" in out
    code, out, _ = cli(["query", "select current_setting('enable_external_access') as x, "
                        "current_setting('lock_configuration') as y", "-r", str(results), "-f", "json"], capsys)
    assert json.loads(out) == [{"x": False, "y": True}]
