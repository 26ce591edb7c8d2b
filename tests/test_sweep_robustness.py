"""``[robustness]`` sweeps: one knob at a time at a fixed rate, each point an ordinary run with the knob
applied (scrape interval, predictor tau, a slowed replica), curves and figures per knob."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmlb_bench.cli import main
from llmlb_bench.errors import UserError
from llmlb_bench.sweep import load_sweep

REPO = Path(__file__).resolve().parents[1]
CHAT = (REPO / "workloads" / "chat.toml").as_posix()

SWEEP = f"""
name = "rob"
slo = "ttft=500ms,tpot=50ms"
seeds = [1]

[workloads]
chat = {{ spec = "{CHAT}", requests = 120 }}

[clusters]
two = {{ replicas = 2 }}

[policies]
jsq = {{ policy = "least_outstanding", args = {{ load = "scraped" }} }}
lpw = {{ policy = "least_predicted_work" }}

[robustness]
rate = 10
signal_refresh_s = [0, 2]
tau = [1.0, 0.0]
slowdown = [1, 6]
slow_at_s = 2
"""


@pytest.mark.slow
def test_robustness_sweep_runs_each_knob_with_its_setting(tmp_path, capsys):
    path = tmp_path / "rob.toml"
    path.write_text(SWEEP)
    main(["sweep", str(path), "-r", str(tmp_path / "res"), "-j", "1", "--format", "json",
          "--figures", str(tmp_path / "fig")])
    summary = json.loads(capsys.readouterr().out)
    curves = {(c["knob"], c["policy"]): c for c in summary["robustness"]}
    # tau runs only for the policy with a predictor
    assert set(curves) == {("signal_refresh_s", "jsq"), ("signal_refresh_s", "lpw"), ("slowdown", "jsq"),
                           ("slowdown", "lpw"), ("tau", "lpw")}
    metas = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "res" / "rob").glob("*/run.json")}
    stale = metas["chat.two.jsq.signal_refresh_s2.s1"]["config"]
    assert stale["cluster"]["signal_refresh_s"] == 2.0 and stale["sweep"]["phase"] == "robust"
    slow = metas["chat.two.lpw.slowdown6.s1"]["config"]["cluster"]["slowdowns"]
    assert slow == [{"target": "r0", "at_s": 2.0, "factor": 6.0}]
    assert metas["chat.two.lpw.tau0.s1"]["config"]["policy"]["args"]["tau"] == 0.0
    assert not metas["chat.two.lpw.slowdown1.s1"]["config"]["cluster"]["slowdowns"]
    # a replica six times slower costs tail latency
    pts = {p["x"]: p for p in curves[("slowdown", "jsq")]["points"]}
    assert pts[6.0]["ttft.p99"]["mean"] > pts[1.0]["ttft.p99"]["mean"]
    figs = sorted(p.name for p in (tmp_path / "fig").glob("*.svg"))
    assert "slowdown.goodput.chat.two.svg" in figs and "tau.ttft_p99.chat.two.svg" in figs
    # a rerun simulates nothing
    main(["sweep", str(path), "-r", str(tmp_path / "res"), "-j", "1"])
    assert "simulated 0 runs" in capsys.readouterr().out


@pytest.mark.parametrize("section,problem", [
    ("rate = 10", "give at least one knob"),
    ("rate = 10\ntau = [2.0]", "Kendall tau lies in [-1, 1]"),
    ("rate = 10\nslowdown = [2]\nslow_target = \"r5\"", "unknown target 'r5'"),
])
def test_bad_robustness_sections(tmp_path, section, problem):
    text = SWEEP.split("[robustness]")[0] + "[robustness]\n" + section + "\n"
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(UserError, match=re.escape(problem)):
        load_sweep(tmp_path / "bad.toml")
