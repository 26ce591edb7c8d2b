"""Control metrics on synthetic signals whose settling time, overshoot and oscillation are known exactly,
and on a simulated run with a load step (report, JSON and gate rules)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from llmlb_bench.metrics.control import edges, sign_changes, spectral_peak, step_response
from llmlb_bench.metrics.run_figures import ControlFigures
from shape_check import mismatches

REPO = Path(__file__).resolve().parents[1]


def test_piecewise_response_has_exact_figures():
    """0 before the step; after it 1.5 for 2 s, 0.8 for 2 s, then 1.0: final 1.0, overshoot 50%,
    settled (10% band) at the first sample after the 0.8 stretch, i.e. 4 s; one crossing."""
    t = np.arange(-20, 20, 0.5)
    y = np.where(t < 0, 0.0, np.where(t < 2, 1.5, np.where(t < 4, 0.8, 1.0)))
    r = step_response(t, y, 0.0, 20.0, reference=0.8)
    assert r["initial"] == 0.0 and r["final"] == 1.0 and r["change"] == 1.0
    assert r["settling_s"] == 4.0 and r["settled"]
    assert r["overshoot"] == pytest.approx(0.5, abs=1e-12)
    assert r["sign_changes"] == 1
    assert r["steady_state_error"] == pytest.approx(0.25, abs=1e-12)


def test_a_falling_step_measures_overshoot_below():
    t = np.arange(-10, 10, 1.0)
    y = np.where(t < 0, 3.0, np.where(t < 3, 0.5, 1.0))
    r = step_response(t, y, 0.0, 10.0)
    assert r["change"] == -2.0 and r["overshoot"] == pytest.approx(0.25) and r["settling_s"] == 3.0


def test_first_order_settles_at_tau_ln10():
    """y = 1 - exp(-t / tau): inside 10% of the change from tau ln 10 on (to one sample)."""
    tau, dt = 4.0, 0.01
    t = np.arange(-200, 200, dt)
    y = np.where(t < 0, 0.0, 1 - np.exp(-np.maximum(t, 0) / tau))
    r = step_response(t, y, 0.0, 200.0)
    assert r["settling_s"] == pytest.approx(tau * math.log(10), abs=dt + 1e-9)
    assert r["overshoot"] == 0.0 and r["sign_changes"] == 0


def test_second_order_overshoot_is_the_textbook_value():
    """Underdamped second order: overshoot exp(-zeta pi / sqrt(1 - zeta^2)) (Ogata 5-3)."""
    zeta, wn, dt = 0.3, 2.0, 0.001
    wd = wn * math.sqrt(1 - zeta**2)
    t = np.arange(-60, 60, dt)
    tp = np.maximum(t, 0)
    y = np.where(t < 0, 0.0, 1 - np.exp(-zeta * wn * tp) * (np.cos(wd * tp) + zeta / math.sqrt(1 - zeta**2)
                                                             * np.sin(wd * tp)))
    r = step_response(t, y, 0.0, 60.0)
    assert r["overshoot"] == pytest.approx(math.exp(-zeta * math.pi / math.sqrt(1 - zeta**2)), abs=1e-5)
    # the envelope exp(-zeta wn t) / sqrt(1 - zeta^2) enters the 10% band at ln(10 / sqrt(1 - zeta^2)) / (zeta wn);
    # the response itself settles at its last excursion past 10% before that
    bound = math.log(10 / math.sqrt(1 - zeta**2)) / (zeta * wn)
    assert bound - math.pi / wd <= r["settling_s"] <= bound
    assert r["sign_changes"] >= 2


def test_a_limit_cycle_shows_in_the_spectrum():
    """A pure sinusoid on a bin of the grid: all energy in that bin, at its frequency."""
    n, dt, k = 400, 0.5, 8
    t = np.arange(n) * dt
    y = np.sin(2 * np.pi * k * t / (n * dt))
    peak = spectral_peak(t, y)
    assert peak["spectral_peak_hz"] == pytest.approx(k / (n * dt))
    assert peak["spectral_peak_share"] == pytest.approx(1.0)
    assert sign_changes(y, 0.5) == 2 * k - 1


def test_a_signal_that_never_settles_says_so():
    """A ramp (the queue of an overloaded open loop): its last quarter, which sets the final value,
    spans more than the band, so its last sample lies outside it."""
    t = np.arange(-100, 100, 1.0)
    y = np.where(t < 0, 0.0, t)
    r = step_response(t, y, 0.0, 100.0)
    assert r["settled"] is False and r["settling_s"] == 100.0     # the whole response: a lower bound


def test_edges_of_step_and_square_specs():
    step = {"tenants": {"a": {"arrival": {"modulation": {"shape": "step", "at_s": 120, "before": 1, "after": 2}}}}}
    assert edges(step) == [120.0]
    square = {"duration_s": 100, "time_scale": 2.0, "tenants": {"a": {"arrival": {"modulation": {
        "shape": "square", "period_s": 40, "duty": 0.25, "low": 1, "high": 3, "start_s": 10}}}}}
    assert edges(square) == [20.0, 40.0, 100.0, 120.0, 180.0]
    assert edges({"tenants": {"a": {"arrival": {"process": "poisson", "rate": 1}}}}) == []
    assert edges(None) == []


STEP_SPEC = """
name = "tiny-step"
seed = 1
duration_s = 100
[tenants.chat]
input = { dist = "lognormal", median = 200, sigma = 0.5, max = 2000 }
output = { dist = "lognormal", median = 100, sigma = 0.5, max = 1000 }
[tenants.chat.arrival]
process = "poisson"
rate = 1.0
modulation = { shape = "step", at_s = 20, before = 1.0, after = 8.0 }
"""


def test_a_run_with_a_load_step_has_control_figures_in_json_and_gate_rules(tmp_path, capsys):
    import json

    from llmlb_bench.gate.rules import parse_rule
    from tests.conftest import cli

    (tmp_path / "step.toml").write_text(STEP_SPEC)
    assert cli(["gen", str(tmp_path / "step.toml"), "-o", str(tmp_path / "t.parquet")], capsys)[0] == 0
    for policy in ("least_outstanding", "pi_admission"):
        code, _, err = cli(["simulate", str(tmp_path / "t.parquet"), "-p", policy, "--replicas", "1", "--max-num-seqs", "4",
                            "-r", str(tmp_path / "r"), "--run-id", policy], capsys)
        assert code == 0, err
    code, out, err = cli(["report", str(tmp_path / "r"), "--slo", "ttft=1s", "--format", "json"], capsys)
    assert code == 0, err
    runs = {r["label"]: r for r in json.loads(out)["runs"]}
    jsq = runs["least_outstanding"]["control"]
    assert jsq["steps"] == [20.0]
    assert mismatches(jsq, ControlFigures, "control") == []   # the shape metrics/run_figures.py declares
    assert jsq["ttft"]["responses"][0]["change"] > 0
    # the open loop is overloaded after the step: its TTFT climbs through the run and never settles
    assert jsq["ttft"]["settled"] is False and jsq["ttft"]["steady_state_error"] > 0
    rule = parse_rule("settling_ttft <= 30")
    value = runs["least_outstanding"]
    for key in rule.metric.path:
        value = value[key]
    assert not rule.holds(value)
    assert parse_rule("oscillation_queue <= 10").metric.path == ("control", "queue", "sign_changes")
    code, out, _ = cli(["report", str(tmp_path / "r"), "--slo", "ttft=1s"], capsys)
    assert "Control: response to the load steps" in out and "not settled" in out


def test_the_documented_sql_gives_the_controlled_signals(tmp_path, capsys):
    """docs/metrics.md's control SQL, run as ``llmlb query`` runs it, gives the bins metrics/control.py reads
    (an open-loop run: sent_s = scheduled_s, so TTFT from either origin is the same)."""
    import re

    from llmlb_bench.metrics.control import series_sql, ttft_sql
    from llmlb_bench.metrics.origin import arrival_runs
    from llmlb_bench.metrics.sql import request_metrics_sql
    from llmlb_bench.metrics.summary import metas_of
    from llmlb_bench.store.views import Catalog
    from tests.conftest import cli

    (tmp_path / "step.toml").write_text(STEP_SPEC.replace("duration_s = 100", "duration_s = 40"))
    assert cli(["gen", str(tmp_path / "step.toml"), "-o", str(tmp_path / "t.parquet")], capsys)[0] == 0
    assert cli(["simulate", str(tmp_path / "t.parquet"), "--replicas", "2", "-r", str(tmp_path / "r"),
                "--run-id", "jsq"], capsys)[0] == 0
    doc = (REPO / "docs" / "metrics.md").read_text()
    block = re.search(r"## Control:.*?```sql\n(.*?)```", doc, re.S).group(1)
    stmts = ["\n".join(ln for ln in part.splitlines() if not ln.strip().startswith("--")).strip().rstrip(";")
             for part in re.split(r";\s*\n", block)]
    ttft_doc, series_doc = [x for x in stmts if x]
    user = Catalog([tmp_path / "r"], confined=True)
    cat = Catalog([tmp_path / "r"])
    cat.con.execute(request_metrics_sql(arrival_runs(metas_of(cat.runs_table))))
    mine = cat.query(ttft_sql(["jsq"], 5.0, 0.9)).to_pylist()
    theirs = user.query_read_only(ttft_doc).to_pylist()
    assert [r["t_s"] for r in mine] == [r["t_s"] for r in theirs]
    assert [r["value"] for r in mine] == pytest.approx([r["ttft_p90"] for r in theirs], abs=1e-9)
    mine_s = cat.query(series_sql(["jsq"], 5.0)).to_pylist()
    theirs_s = user.query_read_only(series_doc).to_pylist()
    assert [(r["t_s"], r["queue"], r["replicas"]) for r in mine_s] == \
        [(r["t_s"], r["queue"], r["replicas"]) for r in theirs_s]
