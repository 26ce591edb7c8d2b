"""``llmlb gate`` on simulated runs: exit codes 0/1/2, Markdown, JUnit XML and JSON, repeats and sweep cells."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from llmlb_bench.cli import main
from llmlb_bench.experiment import simulate_run
from llmlb_bench.schema import read_trace, write_trace
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sweep import make_executor, parse_sweep, run_sweep
from llmlb_bench.workload import generate, load_spec

REPO = Path(__file__).resolve().parents[1]
SLO = "ttft=500ms,tpot=50ms"
RULES = ["goodput >= -5%", "p99_ttft <= +10%", "mean_e2e <= +5%", "attainment >= 0.9"]


def _runs(root: Path, seeds: list[int], cluster: ClusterConfig) -> Path:
    """One run per seed (its own trace) of chat at 30 req/s: the repeats of one configuration."""
    spec = load_spec(REPO / "workloads" / "chat.toml").replace(requests=400)
    for seed in seeds:
        path = root / "traces" / f"s{seed}.parquet"
        write_trace(generate(spec, seed=seed, rate_scale=0.75), path, spec=spec.to_dict())
        simulate_run(read_trace(path), path, cluster, "least_outstanding", {}, seed, root / "runs",
                     run_id=f"s{seed}")
    return root / "runs"


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate")
    good = ClusterConfig.build(replicas=2)
    return {"base": _runs(tmp / "base", [1, 2, 3], good),
            "same": _runs(tmp / "same", [4, 5, 6], good),
            "worse": _runs(tmp / "worse", [4, 5, 6], ClusterConfig.build(replicas=2, max_num_seqs=12)),
            "tmp": tmp}


def _gate(capsys, *args: str) -> tuple[int, str, str]:
    """The exit code main() gives the shell (it returns normally on 0)."""
    try:
        main(["gate", *map(str, args)])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _rule_args(rules: list[str]) -> list[str]:
    return [x for r in rules for x in ("--rule", r)]


def test_same_configuration_other_seeds_passes(sides, capsys):
    code, out, _ = _gate(capsys, sides["base"], sides["same"], "--slo", SLO, *_rule_args(RULES))
    assert code == 0, out
    assert "llmlb gate: pass" in out


def test_a_regression_fails_with_every_output(sides, capsys):
    tmp = sides["tmp"]
    code, out, _ = _gate(capsys, sides["base"], sides["worse"], "--slo", SLO, *_rule_args(RULES),
                         "--markdown", tmp / "gate.md", "--junit", tmp / "gate.xml", "--json", tmp / "gate.json")
    assert code == 1
    assert "regression" in out
    result = json.loads((tmp / "gate.json").read_text())
    assert result["result"] == "regression" and result["exit_code"] == 1
    failed = {v["rule"]: v for v in result["verdicts"] if v["status"] == "fail"}
    assert "p99_ttft <= +10%" in failed and failed["p99_ttft <= +10%"]["low"] > 0.10
    assert failed["p99_ttft <= +10%"]["p_value"] < 0.05
    md = (tmp / "gate.md").read_text()
    assert md.startswith("### ❌ llmlb gate: regression") and "`p99_ttft <= +10%` failed" in md
    suite = ET.parse(tmp / "gate.xml").getroot().find("testsuite")
    assert suite is not None and int(suite.get("tests")) == len(RULES)
    assert int(suite.get("failures")) == len(failed) == len(suite.findall("testcase/failure"))


def test_markdown_and_json_to_stdout_and_a_rules_file(sides, capsys):
    rules = sides["tmp"] / "gate.toml"
    rules.write_text('rules = ["goodput >= -5%", "p99_ttft <= +10%"]\n')
    code, out, _ = _gate(capsys, sides["base"], sides["base"], "--slo", SLO, "--rules", rules, "--json", "-")
    assert code == 0
    doc = json.loads(out)
    assert [v["status"] for v in doc["verdicts"]] == ["pass", "pass"]
    assert all(v["change"] == 0 for v in doc["verdicts"])


@pytest.mark.parametrize("args, fragment", [
    (["--rule", "goodput => 5%"], "cannot parse rule"),
    ([], "give at least one --rule"),
    (["--rule", "goodput >= -5%"], "need an --slo"),
    (["--rules", "missing.toml"], "missing.toml: no such file"),
])
def test_usage_errors_exit_2_with_one_line(sides, capsys, args, fragment):
    code, _, err = _gate(capsys, sides["base"], sides["same"], *args)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and fragment in lines[0], err


def test_missing_results_are_usage_errors(sides, capsys):
    code, _, err = _gate(capsys, sides["base"], sides["tmp"] / "nope", "--rule", "p99_ttft <= +10%")
    assert code == 2 and "no such results directory" in err


def test_sweeps_are_gated_cell_by_cell(tmp_path, capsys):
    def sweep(name: str, seqs: int):
        data = {"name": "g", "slo": SLO, "seeds": [1],
                "workloads": {"chat": {"spec": str(REPO / "workloads" / "chat.toml"), "requests": 200}},
                "clusters": {"two": {"replicas": 2, "max_num_seqs": seqs}},
                "policies": {"rr": {"policy": "round_robin"}}, "load": {"rate": [10, 30]}}
        with make_executor("local", 1) as ex:
            run_sweep(parse_sweep(data, name, REPO), tmp_path / name, ex)
        return tmp_path / name / "g"
    base, cand = sweep("base", 256), sweep("cand", 4)
    code, out, _ = _gate(capsys, base, cand, "--slo", SLO, "--rule", "p99_e2e <= +10%", "--json", "-")
    verdicts = json.loads(out)["verdicts"]
    assert [v["case"] for v in verdicts] == ["chat/two/rr @ rate 10", "chat/two/rr @ rate 30"]
    assert code == 1 and {v["status"] for v in verdicts} == {"fail"}


def _capacity_summary(path: Path, per_seed: list[float]) -> Path:
    """A sweep's summary.json as llmlb sweep writes it (only the fields a capacity rule reads)."""
    path.mkdir(parents=True)
    rows = [{"workload": "chat", "cluster": "a100x4", "policy": "p2c",
             "per_seed": [{"seed": i, "capacity": c} for i, c in enumerate(per_seed)]}]
    (path / "summary.json").write_text(json.dumps({"sweep": "policies", "capacity": rows}))
    return path


def test_capacity_rules_compare_sweeps_over_seeds(tmp_path, capsys):
    base = _capacity_summary(tmp_path / "base" / "policies", [55.0, 57.0, 56.0, 58.0])
    _capacity_summary(tmp_path / "lower" / "policies", [49.0, 50.0, 48.5, 49.5])
    close = _capacity_summary(tmp_path / "close" / "policies", [52.0, 58.0, 57.0, 53.0])
    code, out, _ = _gate(capsys, tmp_path / "base", tmp_path / "lower", "--rule", "capacity >= -5%", "--json", "-")
    (v,) = json.loads(out)["verdicts"]
    assert code == 1 and v["case"] == "capacity: chat/a100x4/p2c" and v["status"] == "fail"
    assert v["change"] == pytest.approx(49.25 / 56.5 - 1) and v["high"] < -0.05 and v["p_value"] < 0.01
    code, out, _ = _gate(capsys, base, close, "--rule", "capacity >= -2%", "--json", "-")
    (v,) = json.loads(out)["verdicts"]
    assert code == 0 and v["status"] == "noise"  # -2.2%, but the seeds spread wider than that
    code, _, err = _gate(capsys, tmp_path / "base", tmp_path, "--rule", "capacity >= -5%")
    assert code == 2 and "no sweep summary.json" in err
