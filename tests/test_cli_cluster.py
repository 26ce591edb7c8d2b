"""--cluster FILE on llmlb simulate / run: example files, overrides by flags, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli, make_trace
from llmlb_bench.schema import write_trace
from llmlb_bench.sim import load_cluster

CLUSTERS = sorted((Path(__file__).resolve().parents[1] / "clusters").glob("*.toml"))




@pytest.mark.parametrize("path", CLUSTERS, ids=[p.stem for p in CLUSTERS])
def test_every_example_cluster_file_is_valid(path):
    cfg = load_cluster(path)
    assert cfg.replicas >= 1


def test_flags_override_the_file_and_reach_run_json(tmp_path, capsys):
    trace = tmp_path / "t.parquet"
    write_trace(make_trace(30, rate=5.0), trace)
    code, out, err = cli(["simulate", str(trace), "--cluster", str(CLUSTERS[0].parent / "hetero.toml"),
                           "--scheduler", "priority", "--results", str(tmp_path / "r"), "-f", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["runs"][0]["requests"] == 30
    [meta] = [json.loads(p.read_text()) for p in (tmp_path / "r").rglob("run.json")]
    cluster = meta["config"]["cluster"]
    assert cluster["scheduler"] == "priority" and [p["name"] for p in cluster["pools"]] == ["h100", "a100"]


def test_pipeline_stages_from_the_flag_are_counted_in_gpus_and_cost(tmp_path, capsys):
    trace = tmp_path / "t.parquet"
    write_trace(make_trace(20, rate=5.0), trace)
    code, out, err = cli(["simulate", str(trace), "--replicas", "2", "--tp", "2", "--pp", "2", "--gpu", "a100-80g",
                           "--results", str(tmp_path / "r"), "-f", "json"], capsys)
    assert code == 0, err
    energy = json.loads(out)["runs"][0]["energy"]
    [meta] = [json.loads(p.read_text()) for p in (tmp_path / "r").rglob("run.json")]
    assert meta["config"]["cluster"]["pools"][0]["pp"] == 2
    assert energy["gpus"] == 8  # 2 replicas x tp 2 x pp 2
    # the report's catalog cost and the simulator's own bill agree
    assert energy["cost_usd"] == pytest.approx(meta["summary"]["cost_usd"], rel=1e-6)


@pytest.mark.parametrize("text, fragment", [
    ("replicas = 2\nflavour = 'x'\n", "unknown field 'flavour'"),
    ("replicas = [", "not valid TOML"),
    ("gpu = 'tpu-v9'\n", "tpu-v9"),
])
def test_bad_cluster_files_are_one_line_errors(tmp_path, capsys, text, fragment):
    bad = tmp_path / "c.toml"
    bad.write_text(text)
    trace = tmp_path / "t.parquet"
    write_trace(make_trace(3), trace)
    code, _, err = cli(["simulate", str(trace), "--cluster", str(bad), "--results", str(tmp_path / "r")], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and fragment in lines[0] and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_missing_cluster_file(tmp_path, capsys):
    trace = tmp_path / "t.parquet"
    write_trace(make_trace(3), trace)
    code, _, err = cli(["simulate", str(trace), "--cluster", str(tmp_path / "none.toml")], capsys)
    assert code == 2 and "none.toml: no such file" in err


@pytest.mark.parametrize("command", ["simulate", "run", "serve"])
def test_every_simulating_command_lists_the_cluster_flags_with_their_defaults(command, capsys, monkeypatch):
    """The flags are declared once (cli.common.cluster_flags) and spliced into each command; the
    bracketed defaults in their help are text, not Rich markup that would swallow them."""
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = cli([command, "--help"], capsys)
    assert code == 0
    for flag in ("--cluster", "--replicas", "--gpu", "--model", "--tp", "--pp", "--max-num-seqs",
                 "--max-batched-tokens", "--scheduler", "--scheduler-arg"):
        assert f" {flag} " in out, flag
    assert "Number of replicas [default: 4]." in out and "[[pools]]" in out
    assert ("--signal-refresh" in out) == (command != "serve")  # a live server has no scrape interval
