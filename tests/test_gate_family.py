"""The gate's family-wise statistics against theory: Holm's adjusted p-values, the step-down max-T over a
joint bootstrap, the family-wise false-fail rate of whole gates, pairing by trace, the repeats-needed figure
against a closed-form power calculation, and the report's relative change. Seeded, so the rates are exact
for this code; the bounds are the level plus three binomial standard errors of the trials run."""

from __future__ import annotations

import math
import sys
from statistics import NormalDist

import numpy as np
import pytest
from scipy import stats

from llmlb_bench.gate import decide_family, holm, parse_rule, relative_change, repeats_needed
from llmlb_bench.gate.outcome import GateOutcome, markdown
from llmlb_bench.gate.samples import RunSample

D = sys.modules["llmlb_bench.gate.decide"]  # the module (the package exports the function decide)


def _binomial_bound(alpha: float, n: int) -> float:
    return alpha + 3 * math.sqrt(alpha * (1 - alpha) / n)


def test_holm_adjusted_p_values_on_a_known_example():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04, then running maximum
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_step_down_max_t_holds_the_level_with_independent_nulls_and_gains_with_dependent_ones():
    rng = np.random.default_rng(0)
    k, trials, alpha, b = 5, 2000, 0.05, 1000
    independent = dependent = 0
    for _ in range(trials):
        t = rng.standard_normal(k)
        null = rng.standard_normal((k, b))
        independent += bool((D.step_down(t, null) < alpha).any())
        same = np.repeat(rng.standard_normal(1), k)  # k copies of one statistic: really one test
        dependent += bool((D.step_down(same, np.repeat(null[:1], k, axis=0)) < alpha).any())
    # independent: the max of k normals, so the family-wise rate is alpha (Holm would give 1 - (1 - a/k)^k <= a)
    assert independent / trials <= _binomial_bound(alpha, trials)
    assert independent / trials >= alpha - 3 * math.sqrt(alpha * (1 - alpha) / trials)
    # perfectly dependent: max-T sees one test at level alpha, where Holm would spend alpha / k on each
    assert abs(dependent / trials - alpha) <= 3 * math.sqrt(alpha * (1 - alpha) / trials)


def _pair(rng: np.random.Generator, trace: str, n: int, noise: np.ndarray, shift: float = 0.0,
          run_id: str = "r") -> RunSample:
    """A run of a common trace: its requests' latencies times exp(run noise) per column (TTFT, TPOT, E2E
    drawn independently), so each column's per-run mean moves by an independent log-normal factor."""
    base = np.random.default_rng(abs(hash(trace)) % 2**32).exponential(1.0, (3, n))
    lat = base * np.exp(noise[:, None] + shift)
    return RunSample(run_id, 100.0, np.ones(n, bool), np.ones(n, bool),
                     {"ttft_s": lat[0], "tpot_s": lat[1], "e2e_s": lat[2]}, {},
                     np.arange(n, dtype=np.int64), trace)


RULES = [parse_rule(r) for r in ("mean_ttft <= +0%", "mean_tpot <= +0%", "mean_e2e <= +0%")]


def _paired_sides(rng, k: int, sigma: float, shift: float = 0.0, n: int = 50):
    base = [_pair(rng, f"t{i}", n, rng.normal(0, sigma, 3), run_id=f"b{i}") for i in range(k)]
    cand = [_pair(rng, f"t{i}", n, rng.normal(0, sigma, 3), shift, run_id=f"c{i}") for i in range(k)]
    return base, cand


def test_a_gate_of_independent_null_rules_fails_at_most_alpha_family_wise():
    """Three rules whose per-run noise is independent, at their limits: the gate (Holm over paired t-tests
    of the runs) fails in at most alpha of the trials, not 3 alpha."""
    rng = np.random.default_rng(1)
    trials, alpha = 600, 0.05
    fails = sum(any(v.status == "fail" for v in decide_family([("c", *_paired_sides(rng, 4, 0.03))], RULES,
                                                              1 - alpha, seed=k)) for k in range(trials))
    assert fails / trials <= _binomial_bound(alpha, trials)
    assert fails > 0  # the level is spent, not wasted


def test_pairing_needs_the_same_traces_and_request_ids():
    rng = np.random.default_rng(2)
    base, cand = _paired_sides(rng, 3, 0.01)
    assert D.pairing(base, cand) is not None
    assert D.pairing(base, cand[:2]) is None
    other = [RunSample(r.run_id, r.window_s, r.ok, r.good, r.latency, r.summary, r.request_id, "x") for r in cand]
    assert D.pairing(base, other) is None
    v = decide_family([("c", base, cand)], RULES[:1])[0]
    assert v.design == "paired runs"
    v = decide_family([("c", base[:1], cand[:1])], RULES[:1])[0]
    assert v.design == "paired" and "one run a side" in v.note
    out = GateOutcome(["b"], ["c"], None, 0.99, verdicts=[v])
    assert "1 checks had one run a side" in markdown(out)
    assert "one run a side" not in markdown(GateOutcome(["b"], ["c"], None, 0.99,
                                                        verdicts=decide_family([("c", base, cand)], RULES[:1])))


def test_repeats_needed_matches_the_closed_form_and_delivers_the_power():
    rule = parse_rule("mean_e2e <= +0%")
    z = NormalDist().inv_cdf(1 - 0.01 / 4) + NormalDist().inv_cdf(0.9)
    delta = math.log1p(0.05)
    # a bootstrap of one run: the normal closed form n = (z_{1-a/m} + z_power)^2 var / delta^2
    assert repeats_needed(0.02, rule, 4, 0.99, "within-run") == math.ceil(z * z * 0.02 / delta ** 2)
    higher = parse_rule("goodput >= -0%")
    assert repeats_needed(0.02, higher, 4, 0.99, "within-run") == math.ceil(z * z * 0.02 / math.log(0.95) ** 2)
    # over paired runs: the t form, (t_{1-a,k-1} + t_{power,k-1})^2 var / k <= delta^2 at k and not at k - 1
    var = 0.003
    k = repeats_needed(var, rule, 1, 0.99, "paired runs")
    t = lambda n: stats.t.ppf(0.99, n - 1) + stats.t.ppf(0.9, n - 1)  # noqa: E731
    assert t(k) ** 2 * var / k <= delta ** 2 < t(k - 1) ** 2 * var / (k - 1)
    # and the gate with that many pairs catches a 5% regression about 90% of the time (noncentral t: exact)
    sigma = math.sqrt(var / 2)  # per-run log noise: a pair's difference has variance 2 sigma^2
    power = stats.nct.sf(stats.t.ppf(0.99, k - 1), k - 1, delta / math.sqrt(var / k))
    assert 0.85 <= power <= 0.95
    rng = np.random.default_rng(3)
    trials = 300
    caught = sum(decide_family([("c", *_paired_sides(rng, k, sigma, delta, n=20))], [rule], 0.99, seed=i)[0].status
                 == "fail" for i in range(trials))
    assert abs(caught / trials - power) <= 3 * math.sqrt(power * (1 - power) / trials) + 0.02


def test_the_gate_reports_repeats_needed_from_the_observed_variance():
    rng = np.random.default_rng(4)
    base, cand = _paired_sides(rng, 4, 0.05)
    v = decide_family([("c", base, cand)], RULES[2:])[0]
    d = np.log([c.latency["e2e_s"].mean() / b.latency["e2e_s"].mean() for b, c in zip(base, cand)])
    assert v.repeats_needed == repeats_needed(float(np.var(d, ddof=1)), RULES[2], 1, 0.99, "paired runs")


def test_weighted_percentile_is_numpys_percentile_of_the_redrawn_sample():
    rng = np.random.default_rng(5)
    x = rng.exponential(1.0, 300)
    w = D._counts(300, 40, rng)
    for q in (0, 50, 90, 99, 100):
        expected = [np.percentile(np.repeat(x, row), q) for row in w]
        assert D._weighted_percentile(x, w, q) == pytest.approx(expected)
    assert (w.sum(axis=1) == 300).all()


def test_relative_change_for_reports():
    rng = np.random.default_rng(6)
    base, cand = _paired_sides(rng, 4, 0.01, math.log(0.8))
    c = relative_change("mean_e2e", base, cand)
    assert c.design == "paired runs" and c.significant and c.low < c.change < c.high < 0
    assert c.change == pytest.approx(np.mean(np.concatenate([r.latency["e2e_s"] for r in cand]))
                                     / np.mean(np.concatenate([r.latency["e2e_s"] for r in base])) - 1)
    same = relative_change("mean_e2e", *_paired_sides(rng, 4, 0.01))
    assert not same.significant and same.low < 0 < same.high and same.p_value > 0.05
    assert relative_change("mean_e2e", [], cand).change is None
