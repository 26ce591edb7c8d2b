"""What a person reads: no Python reprs, thresholds named, library warnings kept off the terminal, empty folders
refused, a --baseline that names no run refused before any work, and the runs view's meta queryable as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow.parquet as pq
import pytest

from llmlb_bench.cli.replay import default_label, sent_line, statuses_text
from llmlb_bench.policies.routing import RoundRobin
from tests.conftest import cli, make_trace

REPO = Path(__file__).resolve().parents[1]


class NoisyPolicy(RoundRobin):
    """A plug-in policy from a third party that warns as libraries do."""

    name = "noisy"

    def __init__(self, **kwargs):
        warnings.warn("something deprecated, in a library", DeprecationWarning, stacklevel=2)
        warnings.warn("a library's user warning", UserWarning, stacklevel=2)
        super().__init__(**kwargs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("text")
    pq.write_table(make_trace(40, rate=8.0), root / "t.parquet")
    from llmlb_bench.cli import main

    for policy in ("round_robin", "least_outstanding"):
        main(["simulate", str(root / "t.parquet"), "--replicas", "2", "--policy", policy, "-r", str(root / "res"),
              "-f", "json"])
    return root / "res"


@pytest.mark.parametrize("args", [["query", "-r", "{empty}", "select count(*) from requests"], ["report", "{empty}"],
                                  ["gate", "{empty}", "{empty}", "--rule", "goodput >= -5%", "--slo", "ttft=1s"]])
def test_a_folder_without_runs_is_an_error(args, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, out, err = cli([a.replace("{empty}", str(tmp_path / "empty")) for a in args], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and str(tmp_path / "empty") in err, (out, err)


def test_baseline_naming_no_run_fails_before_any_figure(runs, capsys, monkeypatch):
    import llmlb_bench.report.output as output

    def no_work(*a, **k):
        raise AssertionError("the report was computed before --baseline was checked")

    monkeypatch.setattr(output, "build", no_work)
    code, _, err = cli(["report", str(runs), "--baseline", "nosuchrun"], capsys)
    assert code == 2 and err.startswith("error: --baseline: no run 'nosuchrun'"), err
    monkeypatch.undo()
    code, out, err = cli(["report", str(runs), "--baseline", "least_outstanding", "--no-ci"], capsys)
    assert code == 0, err


def test_meta_is_json_as_the_help_says(runs, capsys):
    code, out, err = cli(["query", "-r", str(runs), "-f", "json",
                          "select meta.config.policy.name as policy, meta->>'$.config.seed' as seed, typeof(meta) as t "
                          "from runs order by 1"], capsys)
    assert code == 0, err
    assert json.loads(out) == [{"policy": '"least_outstanding"', "seed": "0", "t": "JSON"},
                               {"policy": '"round_robin"', "seed": "0", "t": "JSON"}]


def test_library_warnings_stay_off_the_terminal(runs):
    """A real process (pytest would catch the warnings itself), with a policy plug-in that warns."""
    trace = runs.parent / "t.parquet"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run([sys.executable, "-m", "llmlb_bench", "simulate", str(trace), "--policy",
                           "tests.test_cli_text:NoisyPolicy", "-r", str(runs.parent / "noisy"), "-f", "json"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert done.returncode == 0 and "Warning" not in done.stderr and ".py:" not in done.stderr, done.stderr


def test_statuses_and_the_late_client_read_as_text():
    assert statuses_text({"ok": 148, "timeout": 2}) == "148 ok, 2 timeout"
    assert statuses_text({"error": 3, "ok": 1_500}) == "1,500 ok, 3 error"
    line = sent_line({"sent": 150, "send_rate_rps": 10.0, "statuses": {"ok": 150}},
                     {"dispatch_lag_ms": {"p99": 12.5}, "lag_threshold_ms": 5.0, "flagged": True})
    assert "150 ok" in line and "{" not in line.replace("[bold red]", "").replace("[/]", "")
    assert "over the 5 ms threshold" in line


def test_one_endpoint_is_not_labelled_with_the_clients_policy(tmp_path, capsys):
    from llmlb_bench.replay.selfcheck import noop_server

    assert default_label("http://10.0.0.5:8000", "least_outstanding", 2) == "least_outstanding"
    pq.write_table(make_trace(20, rate=20.0, output_tokens=4), tmp_path / "t.parquet")
    with noop_server(itl_ms=1.0) as url:
        code, out, err = cli(["replay", str(tmp_path / "t.parquet"), "-e", url, "-r", str(tmp_path / "res"),
                              "--no-progress", "--policy", "least_outstanding"], capsys)
    assert code == 0, err
    assert "20 ok" in out and "statuses" not in out and "{'ok'" not in out, out
    [run] = (tmp_path / "res").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["label"] == urlsplit(url).netloc and run.name.startswith(meta["label"].replace(":", "_"))
