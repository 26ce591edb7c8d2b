"""Verdicts: the relative change of each headline figure against a baseline, with interval and significance."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.report.document import ReportOptions, build, to_json
from llmlb_bench.report.shape import ReportDoc
from llmlb_bench.policies import make_policy
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from llmlb_bench.store.views import Catalog
from conftest import cli
from shape_check import mismatches
from sim_helpers import by_request_id, poisson_trace, run_sim

SLO = "ttft=500ms,tpot=50ms"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One busy trace on four replicas: random routing queues far more than least_outstanding."""
    root = tmp_path_factory.mktemp("verdict")
    table = poisson_trace(3000, rate=30.0, seed=4)
    cfg = ClusterConfig.build(replicas=4)
    for policy in ("least_outstanding", "random"):
        run_sim(root, table, cfg, policy=policy, run_id=policy)
    return root


def test_a_clear_difference_is_a_significant_verdict_in_the_right_direction(runs):
    doc = build(Catalog([runs]), ReportOptions(slo=Slo.parse(SLO)))
    v = doc["verdicts"]
    assert v["baseline"] == "least_outstanding"
    [comp] = v["comparisons"]
    by = {c["metric"]: c for c in comp["changes"]}
    tpot = by["p99_tpot"]               # random piles decodes onto some replicas: +28% [+14, +37]
    assert tpot["change"] == pytest.approx(tpot["candidate_value"] / tpot["baseline_value"] - 1)
    assert tpot["significant"] and tpot["direction"] == "worse" and tpot["low"] > 0.05
    assert tpot["low"] <= tpot["change"] <= tpot["high"]
    assert not by["p99_e2e"]["significant"]            # +8% [-11, +25]: within noise
    assert comp["sentence"].startswith("random vs least_outstanding: ") and "TPOT p99 +" in comp["sentence"]
    assert comp["sentence"].endswith("other differences within noise")
    # every adjusted p-value is at least its raw one (Holm)
    assert all(c["p_adjusted"] >= c["p_value"] for c in comp["changes"])
    assert mismatches(json.loads(to_json(doc)), ReportDoc, "report") == []   # the shape report/shape.py declares


def test_baseline_option_flips_the_comparison_and_bad_names_are_user_errors(runs):
    doc = build(Catalog([runs]), ReportOptions(slo=Slo.parse(SLO), baseline="random"))
    [comp] = doc["verdicts"]["comparisons"]
    assert comp["baseline_run"] == "random"
    assert {c["metric"]: c for c in comp["changes"]}["p99_tpot"]["direction"] == "better"
    with pytest.raises(UserError, match="--baseline"):
        build(Catalog([runs]), ReportOptions(baseline="nope"))


def test_runs_alike_but_for_the_seed_differ_within_noise(tmp_path):
    """random routing under two seeds on one trace: only chance tells them apart."""
    cfg = ClusterConfig.build(replicas=4)
    table = poisson_trace(2000, rate=15.0, seed=1)
    targets = []
    for seed in (1, 2):
        with RunStore(tmp_path, config={"policy": {"name": "random"}, "seed": seed}, backend="sim",
                      run_id=f"s{seed}") as run:
            simulate(table, cfg, make_policy("random", seed=seed), run, seed=seed)
        targets.append(by_request_id(pq.read_table(run.dir / "requests.parquet")).column("target"))
    assert targets[0] != targets[1]
    doc = build(Catalog([tmp_path]), ReportOptions(slo=Slo.parse(SLO)))
    [comp] = doc["verdicts"]["comparisons"]
    assert not any(c["significant"] for c in comp["changes"]), comp["changes"]
    assert "no difference beyond noise" in comp["sentence"]


def test_the_verdict_is_on_top_of_every_format(runs, capsys):
    code, out, _ = cli(["report", str(runs), "--slo", SLO], capsys)
    assert code == 0
    assert out.splitlines()[1].startswith("verdict: random vs least_outstanding")
    md = cli(["report", str(runs), "--slo", SLO, "--format", "md"], capsys)[1]
    assert md.split("\n\n")[1].startswith("**Verdict:** random vs least_outstanding")
    doc = json.loads(cli(["report", str(runs), "--slo", SLO, "--format", "json"], capsys)[1])
    assert doc["verdicts"]["comparisons"][0]["sentence"].startswith("random vs least_outstanding")
