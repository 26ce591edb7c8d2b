"""Names a user types: every choice gets the closest known name (one helper, tomlfile.unknown_choice), and a
file given where another kind belongs is named as what it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmlb_bench.tomlfile import KINDS, kind_of, read_toml
from tests.conftest import cli

REPO = Path(__file__).resolve().parents[1]
TRACE = str(REPO / "traces" / "chat-500.parquet")
CHAT = str(REPO / "workloads" / "chat.toml")
SWEEP = str(REPO / "sweeps" / "policies.toml")
CLUSTER = str(REPO / "clusters" / "disaggregated.toml")

MISSPELT = [
    (["report", ".", "--format", "htlm"], "--format: unknown format 'htlm' (did you mean 'html'?"),
    (["report", ".", "--definitions", "guidlm"], "did you mean 'guidellm'?"),
    (["query", "select 1", "-f", "jsn"], "did you mean 'json'?"),
    (["report", ".", "--slo", "tfft=500ms"], "unknown SLO metric 'tfft' (did you mean 'ttft'?"),
    (["simulate", TRACE, "--policy", "leastoutstanding"],
     "--policy: unknown policy 'leastoutstanding' (did you mean 'least_outstanding'?"),
    (["simulate", TRACE, "--gpu", "h100sxm"], "unknown GPU 'h100sxm' (did you mean 'h100-sxm'?"),
    (["simulate", TRACE, "--model", "llama3-8b"], "unknown model 'llama3-8b' (did you mean 'llama-3-8b'?"),
    (["simulate", TRACE, "--scheduler", "priorty"], "unknown engine scheduler 'priorty' (did you mean 'priority'?"),
    (["policies", "leastoutstanding"], "did you mean 'least_outstanding'?"),
    (["repro", "run", "distserv"], "unknown reproduction 'distserv' (did you mean 'distserve'?"),
    (["trace", "import", "azure2023", "x.csv", "-o", "y.parquet"], "unknown format 'azure2023' (did you mean 'azure-2023'?"),
    (["gate", ".", ".", "--rule", "goodptu >= -5%", "--slo", "ttft=1s"], "unknown metric 'goodptu' (did you mean 'goodput'?"),
    (["sweep", SWEEP, "--executor", "lokal"], "unknown executor 'lokal' (did you mean 'local'?"),
    (["run", str(REPO / "workloads" / "caht.toml")], f"no such file (did you mean '{CHAT}'?"),
]

WRONG_KIND = [
    (["sweep", CHAT], "this is a workload spec, not a sweep file"),
    (["gen", SWEEP, "-o", "x.parquet"], "this is a sweep file, not a workload spec"),
    (["run", CLUSTER], "this is a cluster file, not a workload spec"),
    (["simulate", TRACE, "--cluster", CHAT], "this is a workload spec, not a cluster file"),
    (["simulate", CHAT], "this is a workload spec, not a trace Parquet file"),
    (["report", TRACE], "this is a trace Parquet file, not a run folder or a results directory"),
    (["query", "-r", CHAT, "select 1"], "this is a workload spec, not a run folder"),
]


@pytest.mark.parametrize(("args", "says"), MISSPELT + WRONG_KIND, ids=lambda a: " ".join(a)[:40] if isinstance(a, list) else "")
def test_one_line_naming_the_right_thing(args, says, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(args, capsys)
    assert code == 2, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert says in err.replace("\n", ""), err
    assert not (tmp_path / "results").exists() and not (tmp_path / "x.parquet").exists()


def test_no_close_name_lists_the_known_ones(capsys):
    code, _, err = cli(["report", ".", "--format", "xyz"], capsys)
    assert code == 2 and "unknown format 'xyz' (known: terminal, json, md, html)" in err


@pytest.mark.parametrize("folder", ["workloads", "sweeps", "clusters"])
def test_every_shipped_file_is_its_own_kind(folder):
    """The signatures that tell the kinds apart never mistake a shipped file for another kind."""
    want = {"workloads": "workload spec", "sweeps": "sweep file", "clusters": "cluster file"}[folder]
    files = sorted((REPO / folder).glob("*.toml"))
    assert files and want in KINDS
    for f in files:
        assert kind_of(read_toml(f)) == want, f
