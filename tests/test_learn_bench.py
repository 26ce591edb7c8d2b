"""``llmlb learn bench``: a task trains a policy, evaluates it beside heuristics and the bandit on
seeds apart from training, and compares them with the gate's paired statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmlb_bench.cli import main
from llmlb_bench.learn.bench import compare, load_tasks

ROOT = Path(__file__).resolve().parents[1]


def _tasks(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "tasks.toml"
    path.write_text(f'''
[tasks.tiny]
description = "two replicas, a short chat trace"
workload = "{ROOT / 'workloads/chat.toml'}"
requests = 80
cluster = {{ replicas = 2 }}
slo = "ttft=200ms,tpot=50ms"
heuristics = ["round_robin", {{ policy = "power_of_d", args = {{ d = 2 }}, label = "p2c" }}]
train = {{ traces = 1, requests = 60, generations = 1, population = 3, elite = 1 }}
{extra}''')
    return path


def test_bench_trains_evaluates_and_compares_on_evaluation_seeds(tmp_path, capsys):
    out, results = tmp_path / "report", tmp_path / "results"
    main(["learn", "bench", str(_tasks(tmp_path)), "--seeds", "3,4", "-o", str(out), "-r", str(results)])
    doc = json.loads((out / "results.json").read_text())
    [rec] = doc["tasks"]
    assert rec["eval_seeds"] == [3, 4] and rec["train_seeds"] == [1_000_000]
    assert set(rec["figures"]) == {"round_robin", "p2c", "bandit", "learned"}
    att = rec["figures"]["learned"]["attainment"]
    assert len(att["per_seed"]) == 2 and att["low"] <= att["mean"] <= att["high"]
    assert {c["candidate"] for c in rec["comparisons"]} == {"bandit", "learned"}
    assert all(c["design"] == "paired runs" or c["change"] == 0 for c in rec["comparisons"])
    assert all(c["verdict"] in ("win", "tie", "loss") for c in rec["comparisons"])
    # the runs are ordinary stored runs of the evaluation traces; the trained file is the one evaluated
    assert (results / "tiny" / "learned-seed3" / "run.json").is_file()
    policy = json.loads((out / "tiny" / "policy.json").read_text())
    assert policy["training"]["trace"]["seeds"] == [1_000_000]
    assert "## tiny" in (out / "README.md").read_text()


@pytest.mark.parametrize("args, fragment", [
    (["--seeds", "1,1000001"], "error: --seeds: evaluation seed 1000001 is a training seed"),
    (["--seeds", "1"], "error: --seeds: give two or more distinct seeds"),
    (["--task", "nope"], "error: --task: no task 'nope'"),
])
def test_bench_bad_input_is_one_line_before_work(tmp_path, capsys, args, fragment):
    with pytest.raises(SystemExit) as info:
        main(["learn", "bench", str(_tasks(tmp_path)), "-o", str(tmp_path / "o"), "-r", str(tmp_path / "r"), *args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(lines) == 1 and lines[0].startswith(fragment), lines
    assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()


def test_a_task_naming_an_unknown_policy_or_objective_is_refused_on_load(tmp_path):
    from llmlb_bench.errors import UserError

    bad = _tasks(tmp_path).read_text().replace('"round_robin"', '"round_robbin"')
    (tmp_path / "t.toml").write_text(bad)
    with pytest.raises(UserError, match="unknown policy 'round_robbin'"):
        load_tasks(tmp_path / "t.toml")
    (tmp_path / "t.toml").write_text(_tasks(tmp_path).read_text().replace('slo = ', 'objective = "speed"\nslo = '))
    with pytest.raises(UserError, match="unknown reward term 'speed'"):
        load_tasks(tmp_path / "t.toml")


def test_verdicts_follow_the_direction_of_each_figure():
    # paired runs (same trace per seed): a candidate with half the TTFT wins on TTFT, ties on an equal
    # attainment; swapped, it loses
    import numpy as np

    from llmlb_bench.gate.samples import RunSample

    def run(i: int, ttft: float) -> RunSample:
        n = 200
        lat = {"ttft_s": np.full(n, ttft), "tpot_s": np.full(n, 0.01), "e2e_s": np.full(n, 1.0)}
        return RunSample(f"r{i}-{ttft}", 10.0, np.ones(n, bool), np.ones(n, bool), lat, {}, np.arange(n), f"t{i}")

    slow = [run(i, 0.1 + 0.01 * i) for i in range(5)]
    fast = [run(i, 0.05 + 0.004 * i) for i in range(5)]
    verdicts = {r["figure"]: r["verdict"] for r in compare({"b": slow, "c": fast}, "b", ["c"])}
    assert verdicts == {"attainment": "tie", "mean_ttft": "win", "p99_ttft": "win"}
    verdicts = {r["figure"]: r["verdict"] for r in compare({"b": fast, "c": slow}, "b", ["c"])}
    assert verdicts == {"attainment": "tie", "mean_ttft": "loss", "p99_ttft": "loss"}


def test_the_committed_benchmark_policies_load_with_this_feature_layout():
    # reports/learning/ holds the files the benchmark trained: a change of the feature layout that
    # makes them unreadable must bump its version and rerun the benchmark (llmlb learn bench)
    from llmlb_bench.policies import RouteRequest, TargetInfo, View, make_policy

    files = sorted((ROOT / "reports" / "learning").glob("*/policy.json"))
    assert len(files) >= 4
    for f in files:
        policy = make_policy("learned", {"path": str(f)})
        view = View([TargetInfo(f"t{i}") for i in range(4)], outstanding_requests=[3, 0, 5, 1])
        assert 0 <= policy.choose(RouteRequest(0, 0.0, 100, 50), view) < 4
