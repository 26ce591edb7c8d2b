"""Gate rules and decisions on synthetic samples with known distributions.

The property that matters in CI: with no real change the gate fails rarely
(at most its level, 1 - confidence, even with a zero allowance that the
point estimate violates half the time), and a real regression beyond the
allowance fails nearly always. Requests here are independent, so a single
run a side (a block bootstrap within it) is a fair test. Trials are seeded, so the rates are exact
for this code, not flaky.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.gate import decide, load_rules, parse_rule
from llmlb_bench.gate.samples import RunSample


def run(rng: np.random.Generator, n: int = 600, scale: float = 1.0, p_good: float = 0.95,
        duration: float = 100.0, summary: dict | None = None, run_id: str = "r") -> RunSample:
    e2e = rng.exponential(scale, n)
    good = rng.random(n) < p_good
    return RunSample(run_id, duration, np.ones(n, bool), good,
                     {"ttft_s": e2e / 10, "tpot_s": e2e / 100, "e2e_s": e2e}, summary or {})


def test_rules_parse_relative_absolute_units_and_aliases():
    r = parse_rule("goodput >= -5%")
    assert (r.metric.name, r.op, r.limit, r.relative, r.wants_higher) == ("goodput", ">=", -0.05, True, True)
    r = parse_rule("ttft.p99 <= +10%")
    assert (r.metric.name, r.limit, r.relative, r.wants_higher) == ("p99_ttft", pytest.approx(0.10), True, False)
    assert parse_rule("p99_e2e <= 20s").limit == 20.0 and not parse_rule("p99_e2e <= 20s").relative
    assert parse_rule("mean_tpot < 50ms").limit == pytest.approx(0.05)
    assert parse_rule("attainment >= 0.95").limit == 0.95
    assert parse_rule("jain >= 0.9").metric.kind == "run"
    assert parse_rule("energy_per_good_token <= +3%").metric.path == ("energy", "j_per_good_token")


@pytest.mark.parametrize("text, fragment", [
    ("goodput => -5%", "cannot parse rule"),
    ("speed >= -5%", "unknown metric 'speed'"),
    ("p99_ttft <= 500", "needs a unit"),
    ("goodput >= 5ms", "takes a relative"),
])
def test_bad_rules_are_user_errors(text, fragment):
    with pytest.raises(UserError, match=fragment):
        parse_rule(text)


def test_rules_file(tmp_path):
    f = tmp_path / "gate.toml"
    f.write_text('rules = ["goodput >= -5%", "p99_ttft <= +10%"]\n')
    assert [r.metric.name for r in load_rules(f)] == ["goodput", "p99_ttft"]
    f.write_text('rules = ["goodput >= -5%", "nope <= 1"]\n')
    with pytest.raises(UserError, match=r"rules\[1\].*unknown metric 'nope'"):
        load_rules(f)
    f.write_text('rule = ["goodput >= -5%"]\n')
    with pytest.raises(UserError, match="unknown field 'rule'"):
        load_rules(f)


def test_point_estimates_follow_the_metric_definitions():
    rng = np.random.default_rng(0)
    a, b = run(rng, run_id="a", duration=50.0), run(rng, run_id="b", duration=150.0)
    e2e = np.concatenate([a.latency["e2e_s"], b.latency["e2e_s"]])
    good = a.good.sum() + b.good.sum()
    v = decide("c", parse_rule("p99_e2e <= 1000s"), [], [a, b])
    assert v.candidate == pytest.approx(np.percentile(e2e, 99))
    assert decide("c", parse_rule("goodput >= 0"), [], [a, b]).candidate == pytest.approx(good / 200.0)
    assert decide("c", parse_rule("attainment >= 0"), [], [a, b]).candidate == pytest.approx(good / 1200)
    assert decide("c", parse_rule("mean_ttft <= 1s"), [], [a, b]).candidate == pytest.approx(e2e.mean() / 10)


@pytest.mark.parametrize("rule", ["p99_e2e <= +0%", "mean_e2e <= +0%", "attainment >= -0%", "goodput >= -0%"])
def test_noise_alone_rarely_fails(rule):
    """Same distribution on both sides, a zero allowance: the point estimate violates the rule in about
    half the trials, the gate fails in at most a few percent."""
    rng = np.random.default_rng(1)
    parsed = parse_rule(rule)
    statuses = [decide("c", parsed, [run(rng)], [run(rng)], seed=k, b=300).status for k in range(300)]
    assert statuses.count("noise") > 100                # violations seen, judged as noise
    assert statuses.count("fail") / len(statuses) <= 0.01 + 3 * (0.01 * 0.99 / 300) ** 0.5  # level 1% + 3 SE


@pytest.mark.parametrize("rule, change", [("p99_e2e <= +10%", dict(scale=1.5)), ("mean_e2e <= +10%", dict(scale=1.3)),
                                          ("attainment >= -2%", dict(p_good=0.85)),
                                          ("goodput >= -5%", dict(p_good=0.80))])
def test_a_real_regression_fails_nearly_always(rule, change):
    rng = np.random.default_rng(2)
    parsed = parse_rule(rule)
    statuses = [decide("c", parsed, [run(rng, 2000)], [run(rng, 2000, **change)], seed=k, b=300).status
                for k in range(40)]
    assert statuses.count("fail") >= 38


def test_repeats_are_pooled_and_compared_over_runs():
    """Several runs a side (of other traces): the figure pools their requests, the test looks at the
    spread of the runs' own values (Welch), which is what a repeat moves."""
    rng = np.random.default_rng(3)
    base = [run(rng, 400, run_id=f"b{i}") for i in range(5)]
    cand = [run(rng, 400, scale=1.4, run_id=f"c{i}") for i in range(5)]
    v = decide("c", parse_rule("mean_e2e <= +10%"), base, cand, b=500)
    assert v.design == "runs" and v.status == "fail" and v.low > 0.10 and v.p_value < 0.01
    assert v.change == pytest.approx(np.mean(np.concatenate([r.latency["e2e_s"] for r in cand]))
                                     / np.mean(np.concatenate([r.latency["e2e_s"] for r in base])) - 1)


def test_absolute_rule_fails_only_when_the_interval_is_below_the_limit():
    rng = np.random.default_rng(4)
    clearly_low = decide("c", parse_rule("attainment >= 0.95"), [], [run(rng, 2000, p_good=0.90)])
    assert clearly_low.status == "fail" and clearly_low.high < 0.95
    borderline = decide("c", parse_rule("attainment >= 0.95"), [], [run(rng, 200, p_good=0.945)], seed=1)
    assert borderline.status in ("pass", "noise")


def test_run_level_figures_use_repeats_or_decide_on_points():
    rng = np.random.default_rng(5)
    fair = lambda j, i: run(rng, 50, summary={"fairness": {"jain_service": j}}, run_id=f"r{i}")  # noqa: E731
    single = decide("c", parse_rule("jain >= 0.9"), [], [fair(0.85, 0)])
    assert single.status == "fail" and single.low is None and "single run" in single.note
    repeats = decide("c", parse_rule("jain >= -1%"), [fair(0.95 + 0.005 * i, i) for i in range(4)],
                     [fair(0.90 + 0.005 * i, 4 + i) for i in range(4)])
    assert repeats.status == "fail" and repeats.high < -0.01 and repeats.design == "runs"
    assert decide("c", parse_rule("jain >= 0.9"), [], [run(rng, 50)]).status == "missing"


def test_decisions_are_deterministic_for_a_seed():
    rng = np.random.default_rng(6)
    base, cand = [run(rng)], [run(rng, scale=1.05)]
    a = decide("c", parse_rule("p99_e2e <= +0%"), base, cand, seed=3)
    b = decide("c", parse_rule("p99_e2e <= +0%"), base, cand, seed=3)
    assert a == b
