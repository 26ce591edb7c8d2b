"""The Kendall-tau length oracle and routing by predicted work."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from llmlb_bench.policies import RouteRequest, TargetInfo, View, make_policy
from llmlb_bench.policies.oracle import KendallOracle


def lengths(kind: str, n: int = 8000, seed: int = 1) -> list[int]:
    rng = np.random.default_rng(seed)
    if kind == "lognormal":  # chat-like output lengths
        x = rng.lognormal(5.0, 1.0, n)
    elif kind == "uniform":
        x = rng.integers(1, 2000, n)
    else:  # geometric: many ties among short lengths
        x = rng.geometric(1 / 40, n)
    return np.maximum(1, np.round(x)).astype(int).tolist()


@pytest.mark.parametrize("kind", ["lognormal", "uniform", "geometric"])
@pytest.mark.parametrize("tau", [-0.5, 0.0, 0.3, 0.6, 0.9])
def test_oracle_rank_correlation_matches_the_target_tau(kind, tau):
    true = lengths(kind)
    oracle = KendallOracle(tau, seed=11)
    predicted = [oracle.predict(x) for x in true]
    # standard error of tau on 8000 pairs is below 0.01
    assert stats.kendalltau(true, predicted).statistic == pytest.approx(tau, abs=0.03)


def test_perfect_oracle_returns_the_truth_and_predictions_keep_the_length_distribution():
    true = lengths("lognormal")
    assert [KendallOracle(1.0).predict(x) for x in true[:200]] == true[:200]
    oracle = KendallOracle(0.3, seed=2)
    predicted = [oracle.predict(x) for x in true]
    # same marginal: the two samples are indistinguishable to a two-sample KS test
    assert stats.ks_2samp(true[2000:], predicted[2000:]).pvalue > 0.001


def test_oracle_is_deterministic_per_seed():
    true = lengths("uniform", 500)
    a, b, c = KendallOracle(0.5, seed=4), KendallOracle(0.5, seed=4), KendallOracle(0.5, seed=5)
    pa = [a.predict(x) for x in true]
    assert pa == [b.predict(x) for x in true]
    assert pa != [c.predict(x) for x in true]


def test_oracle_rejects_tau_outside_minus_one_one():
    with pytest.raises(ValueError):
        KendallOracle(1.5)


def test_least_predicted_work_balances_predicted_tokens_and_releases_them():
    pol = make_policy("least_predicted_work", {"tau": 1.0})
    v = View([TargetInfo("a"), TargetInfo("b")])
    long = RouteRequest(1, 0.0, 10, 1000)
    shorts = [RouteRequest(2 + i, 0.0, 10, 100) for i in range(5)]
    t_long = pol.choose(long, v)
    # JSQ would alternate; predicted work sends every short request away from the long one
    assert {pol.choose(r, v) for r in shorts} == {1 - t_long}
    pol.on_complete(long, t_long, v)
    assert pol.choose(RouteRequest(9, 0.0, 10, 100), v) == t_long


def test_least_predicted_work_counts_prompt_tokens_with_input_weight():
    pol = make_policy("least_predicted_work", {"tau": 1.0, "input_weight": 1.0})
    v = View([TargetInfo("a"), TargetInfo("b")])
    first = pol.choose(RouteRequest(1, 0.0, 5000, 10), v)
    assert pol.choose(RouteRequest(2, 0.0, 10, 1000), v) == 1 - first
