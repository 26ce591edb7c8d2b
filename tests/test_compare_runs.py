"""One baseline rule (report/baseline.py); comparisons only within a workload (metrics/comparable.py), in reports and gates."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from conftest import cli

SLO = "ttft=500ms,tpot=50ms"
SPEC = """
name = "tiny"
seed = 1
requests = {n}

[tenants.chat]
arrival = {{ process = "poisson", rate = {rate} }}
input = {{ dist = "lognormal", median = 200, sigma = 0.5, max = 2000 }}
output = {{ dist = "lognormal", median = 60, sigma = 0.5, max = 500 }}
"""


def _spec(tmp: Path, n: int = 300, rate: float = 20.0, name: str = "tiny.toml") -> Path:
    path = tmp / name
    path.write_text(SPEC.format(n=n, rate=rate))
    return path


def _verdicts(out: str) -> list[str]:
    return [line.split("verdict: ", 1)[1] for line in out.splitlines() if line.startswith("verdict: ")]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """``llmlb run`` with round_robin first: its folder names sort the other way (least_... < round_...)."""
    from llmlb_bench.cli import main

    tmp = tmp_path_factory.mktemp("baseline")
    results = tmp / "results"
    out = io.StringIO()          # capsys is per test: the module's one run prints into this
    with contextlib.redirect_stdout(out):
        main(["run", str(_spec(tmp)), "-p", "round_robin", "-p", "least_outstanding", "--replicas", "2",
              "--results", str(results), "--slo", SLO])
    return tmp, results, out.getvalue()


def test_run_and_report_over_its_folder_name_the_same_baseline(batch, capsys):
    _, results, run_out = batch
    assert [v.split(":")[0] for v in _verdicts(run_out)] == ["least_outstanding vs round_robin"]
    code, out, _ = cli(["report", str(results), "--slo", SLO], capsys)
    assert code == 0
    assert _verdicts(out) == _verdicts(run_out)        # the same orientation, signs and all
    doc = json.loads(cli(["report", str(results), "--slo", SLO, "--format", "json"], capsys)[1])
    assert doc["verdicts"]["comparisons"][0]["baseline"] == "round_robin"


def test_baseline_by_policy_and_a_name_matching_several_runs_is_a_one_line_error(batch, capsys):
    tmp, results, _ = batch
    code, out, _ = cli(["report", str(results), "--slo", SLO, "--baseline", "least_outstanding"], capsys)
    assert code == 0 and _verdicts(out)[0].startswith("round_robin vs least_outstanding")
    # a second batch: now two runs are round_robin
    cli(["run", str(_spec(tmp)), "-p", "round_robin", "--replicas", "2", "--results", str(results), "--seed", "2",
         "--slo", SLO], capsys)
    code, out, err = cli(["report", str(results), "--baseline", "round_robin"], capsys)
    assert code == 2
    [line] = err.strip().splitlines()
    assert line.startswith("error: --baseline: 'round_robin' matches 2 runs (")
    assert len(re.findall(r"-[0-9a-f]{4}-round_robin\b", line)) == 2 and "Traceback" not in err


def test_runs_of_different_workloads_are_compared_only_within_their_group(tmp_path, capsys):
    """The issue's example: a 300- and a 200-request trace of different specs in one folder."""
    results = tmp_path / "results"
    for n, rate in ((300, 20.0), (200, 10.0)):
        cli(["run", str(_spec(tmp_path, n, rate, f"w{n}.toml")), "-p", "round_robin", "-p", "least_outstanding",
             "--replicas", "2", "--results", str(results), "--slo", SLO], capsys)
    code, out, _ = cli(["report", str(results), "--slo", SLO, "--format", "json"], capsys)
    assert code == 0
    v = json.loads(out)["verdicts"]
    assert len(v["groups"]) == 2 and all(len(g["runs"]) == 2 for g in v["groups"])
    assert len(v["comparisons"]) == 2
    runs_of = {r: i for i, g in enumerate(v["groups"]) for r in g["runs"]}
    for c in v["comparisons"]:               # never across groups, always against the group's round_robin
        assert runs_of[c["candidate_run"]] == runs_of[c["baseline_run"]]
        assert c["baseline_run"].endswith("round_robin")
    note = v["groups_note"]
    assert "2 different workloads" in note and "requests 200 vs 300" in note
    assert "tenants.chat.arrival.rate 10 vs 20" in note
    md = cli(["report", str(results), "--slo", SLO, "--format", "md"], capsys)[1]
    assert "> Note: these runs are of 2 different workloads" in md
    # a named baseline is each group's run of that name; a group without one is not compared
    doc = json.loads(cli(["report", str(results), "--slo", SLO, "--format", "json", "--baseline",
                          "least_outstanding"], capsys)[1])
    assert sorted(c["baseline_run"][-17:] for c in doc["verdicts"]["comparisons"]) == ["least_outstanding"] * 2
    doc = json.loads(cli(["report", str(results), "--slo", SLO, "--format", "json", "--baseline",
                          v["groups"][0]["runs"][1]], capsys)[1])
    assert len(doc["verdicts"]["comparisons"]) == 1
    assert "1 group(s) without one are not compared" in doc["verdicts"]["groups_note"]


def test_a_gate_between_different_workloads_is_refused_naming_the_fields(tmp_path, capsys):
    for side, n in (("main", 300), ("pr", 200)):
        cli(["run", str(_spec(tmp_path, n, name=f"{side}.toml")), "-p", "least_outstanding", "--replicas", "2",
             "--results", str(tmp_path / side), "--slo", SLO], capsys)
    args = ["gate", str(tmp_path / "main"), str(tmp_path / "pr"), "--slo", SLO, "--rule", "p99_ttft <= +10%"]
    code, out, err = cli(args, capsys)
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert "the baseline's and the candidate's runs are not comparable (workload, load or SLO differ): requests " \
           "300 vs 200" in line
    assert "--allow-different-workloads" in line
    code, out, _ = cli(args + ["--allow-different-workloads", "--json", "-"], capsys)
    assert code in (0, 1)
    [v] = json.loads(out)["verdicts"]
    assert "compared anyway (--allow-different-workloads): " in v["note"] and "requests 300 vs 200" in v["note"]
    # two seeds of one spec are one workload (repeats): no refusal
    cli(["run", str(_spec(tmp_path, 300, name="main.toml")), "-p", "least_outstanding", "--replicas", "2",
         "--results", str(tmp_path / "again"), "--seed", "7", "--slo", SLO], capsys)
    assert cli(["gate", str(tmp_path / "main"), str(tmp_path / "again"), "--slo", SLO, "--rule",
                "p99_ttft <= +50%"], capsys)[0] in (0, 1)


def test_the_footer_names_the_traces_seed_and_the_simulators_apart(tmp_path, capsys):
    """A trace generated with seed 1, simulated with seeds 0 and 3: the report said 'seed 0' / 'seed 3' only."""
    trace = tmp_path / "t.parquet"
    cli(["gen", str(_spec(tmp_path)), "-o", str(trace), "--seed", "1"], capsys)
    for seed in ("0", "3"):
        cli(["simulate", str(trace), "--replicas", "2", "--seed", seed, "--results", str(tmp_path / "r")], capsys)
    doc = json.loads(cli(["report", str(tmp_path / "r"), "--format", "json"], capsys)[1])
    assert "trace seed 1" in doc["common"].split(" · ")
    assert sorted(s["name"] for s in doc["runs"]) == ["sim seed 0", "sim seed 3"]
    out = cli(["report", str(tmp_path / "r")], capsys)[1]
    assert "trace seed 1" in " ".join(out.split()) and "sim seed 3" in out


def test_a_capacity_gate_between_sweeps_judged_by_other_slos_is_refused(tmp_path, capsys):
    """Capacity rules read sweeps' summary.json: capacities at 90% of TTFT 500 ms and of TTFT 1 s differ in
    meaning, not in performance."""
    for side, slo in (("main", "ttft=500ms"), ("pr", "ttft=1s")):
        (tmp_path / side).mkdir()
        (tmp_path / side / "summary.json").write_text(json.dumps({
            "sweep": "s", "slo": slo, "target": 0.9,
            "capacity": [{"workload": "chat", "cluster": "a", "policy": "rr",
                          "per_seed": [{"seed": s, "capacity": 10.0 + s} for s in (1, 2, 3)]}]}))
    args = ["gate", str(tmp_path / "main"), str(tmp_path / "pr"), "--rule", "capacity >= -5%"]
    code, _, err = cli(args, capsys)
    assert code == 2
    assert "not comparable (workload, load or SLO differ): slo ttft=500ms vs ttft=1s" in err.strip()
    assert cli(args + ["--allow-different-workloads"], capsys)[0] == 0
