"""The main job end to end: spec -> trace -> simulated runs under two policies -> report and query."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from llmlb_bench.cli import main
from llmlb_bench.store.views import Catalog

REPO = Path(__file__).resolve().parents[1]
SMALL_SPEC = """
seed = 11
requests = 300

[tenants.chat]
arrival = { process = "poisson", rate = 20.0 }
input = { dist = "lognormal", median = 400, sigma = 0.8, max = 4000 }
output = { dist = "lognormal", median = 150, sigma = 0.7, max = 1000 }
"""


def _run(args, capsys):
    try:
        main(args)
    except SystemExit as e:
        assert e.code in (0, None), capsys.readouterr().err
    return capsys.readouterr().out


@pytest.fixture
def spec(tmp_path) -> Path:
    p = tmp_path / "small.toml"
    p.write_text(SMALL_SPEC)
    return p


def test_run_compares_two_policies_and_query_answers(spec, tmp_path, capsys):
    results = tmp_path / "results"
    out = _run(["run", str(spec), "--results", str(results), "--format", "json"], capsys)
    doc = json.loads(out[out.index("{"):])
    runs = doc["runs"]
    assert [r["policy"] for r in runs] == ["round_robin", "least_outstanding"]
    for r in runs:
        assert r["requests"] == 300 and r["ok"] + r["rejected"] == 300
        assert r["ttft"]["p50"] > 0 and r["tpot"]["p50"] > 0
        assert 0.0 <= r["slo"]["attainment"] <= 1.0
    q = _run(["query", "select count(*) as n from requests", "--results", str(results), "--format", "json"], capsys)
    assert json.loads(q) == [{"n": 600}]
    files = list(results.rglob("requests.parquet"))
    assert len(files) == 2 and all(f.parent.joinpath("run.json").is_file() for f in files)


def test_same_seed_gives_identical_rows(spec, tmp_path, capsys):
    tables = []
    for name in ("a", "b"):
        results = tmp_path / name
        _run(["run", str(spec), "--results", str(results), "-p", "least_outstanding", "--format", "json"], capsys)
        t = Catalog([results]).query("select * exclude (run_id) from requests order by request_id")
        tables.append(t)
    assert tables[0].num_rows == 300
    assert tables[0].equals(tables[1])


def test_terminal_report_of_the_shipped_chat_workload_has_both_policies(tmp_path, capsys):
    out = _run(["run", str(REPO / "workloads" / "chat.toml"), "--results", str(tmp_path)], capsys)
    assert "round_robin" in out and "least_outstanding" in out and "TTFT p99" in out and "goodput" in out
    meta = [json.loads(p.read_text()) for p in tmp_path.rglob("run.json")]
    assert {m["status"] for m in meta} == {"complete"}
    assert all(m["trace"]["sha256"] and m["config"]["cluster"] for m in meta)
    counts = Catalog([tmp_path]).query("select run_id, count(*) n from requests group by 1")
    assert pc.min(counts.column("n")).as_py() == pc.max(counts.column("n")).as_py()
