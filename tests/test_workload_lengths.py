"""Length distributions: each against a reference (SciPy) by KS / chi-square, plus caps and copula."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from llmlb_bench.errors import UserError
from llmlb_bench.workload import WorkloadSpec, generate
from llmlb_bench.workload.distributions import parse_distribution, parse_lengths
from llmlb_bench.workload.fields import Section

N = 100_000


def dist(**table):
    return parse_distribution(Section(table, "tenants.t.input", "spec.toml"))


CONTINUOUS = [
    ({"dist": "lognormal", "median": 500, "sigma": 1.2}, stats.lognorm(1.2, scale=500)),
    ({"dist": "lognormal", "mu": 3.0, "sigma": 0.4}, stats.lognorm(0.4, scale=math.exp(3.0))),
    ({"dist": "pareto", "alpha": 1.3, "low": 100, "high": 100_000}, stats.truncpareto(1.3, 1000, scale=100)),
    ({"dist": "exponential", "mean": 250}, stats.expon(scale=250)),
    ({"dist": "uniform", "low": 10, "high": 90}, stats.uniform(10, 80)),
]


@pytest.mark.parametrize("table,ref", CONTINUOUS, ids=[t["dist"] + str(i) for i, (t, _) in enumerate(CONTINUOUS)])
def test_continuous_against_scipy(table, ref):
    d = dist(**table)
    x = d.sample(np.random.default_rng(3), N)
    assert stats.kstest(x, ref.cdf).pvalue > 0.01
    grid = ref.ppf(np.linspace(0.01, 0.99, 50))
    assert np.allclose(d.cdf(grid), ref.cdf(grid), atol=1e-9)
    assert np.allclose(d.ppf(np.linspace(0.01, 0.99, 50)), grid, rtol=1e-7)
    assert math.isclose(d.mean(), ref.mean(), rel_tol=1e-6)


def test_zipf_against_scipy():
    d = dist(dist="zipf", s=1.1, n=50)
    x = d.sample(np.random.default_rng(4), N).astype(int)
    ref = stats.zipfian(1.1, 50)
    observed = np.bincount(x, minlength=51)[1:]
    assert stats.chisquare(observed, ref.pmf(np.arange(1, 51)) * N).pvalue > 0.01
    assert math.isclose(d.mean(), ref.mean(), rel_tol=1e-9)


def test_fixed_and_empirical_pdf():
    assert np.all(dist(dist="fixed", value=576).sample(np.random.default_rng(0), 10) == 576)
    d = dist(dist="empirical", values=[100, 200, 4000], probs=[0.5, 0.3, 0.2])
    x = d.sample(np.random.default_rng(5), N)
    observed = [np.sum(x == v) for v in (100, 200, 4000)]
    assert stats.chisquare(observed, np.array([0.5, 0.3, 0.2]) * N).pvalue > 0.01
    assert d.cdf(np.array([99, 100, 150, 4000]))[[0, 1, 2, 3]].tolist() == [0.0, 0.5, 0.5, 1.0]


def test_empirical_quantiles_are_piecewise_linear():
    d = dist(dist="empirical", quantiles=[[0.0, 10], [0.5, 100], [0.9, 1000], [1.0, 5000]])
    x = d.sample(np.random.default_rng(6), N)
    assert stats.kstest(x, d.cdf).pvalue > 0.01
    assert abs(np.median(x) - 100) < 3 and abs(np.quantile(x, 0.9) - 1000) < 30
    assert np.allclose(d.cdf(d.ppf(np.array([0.1, 0.5, 0.95]))), [0.1, 0.5, 0.95])
    assert math.isclose(d.mean(), x.mean(), rel_tol=0.02)


def test_mixture_is_bimodal_and_inverts():
    # reasoning-style output: short answers and long chains of thought
    d = dist(dist="mixture", components=[{"weight": 0.3, "dist": "lognormal", "median": 300, "sigma": 0.5},
                                         {"weight": 0.7, "dist": "lognormal", "median": 6000, "sigma": 0.4}])
    x = d.sample(np.random.default_rng(7), N)
    assert stats.kstest(x, d.cdf).pvalue > 0.01
    assert abs((x < 1500).mean() - 0.3) < 0.01
    u = np.array([0.05, 0.3, 0.5, 0.99])
    assert np.allclose(d.cdf(d.ppf(u)), u, atol=1e-3)
    assert math.isclose(d.mean(), x.mean(), rel_tol=0.02)


def test_caps_clip_and_round():
    lengths = parse_lengths(Section({"dist": "pareto", "alpha": 0.8, "low": 1, "high": 1e6, "min": 16, "max": 4096},
                                    "x", "spec.toml"))
    t = lengths.sample(np.random.default_rng(8), N)
    assert t.dtype == np.int32 and t.min() == 16 and t.max() == 4096


def test_gaussian_copula_correlates_input_and_output():
    rho = 0.6
    spec = WorkloadSpec.from_dict({"seed": 2, "requests": N, "tenants": {"t": {
        "arrival": {"process": "poisson", "rate": 100.0}, "io_correlation": rho,
        "input": {"dist": "lognormal", "median": 800, "sigma": 1.0},
        "output": {"dist": "pareto", "alpha": 1.5, "low": 20, "high": 8000}}}})
    table = generate(spec)
    inp = table.column("input_tokens").to_numpy()
    out = table.column("output_tokens").to_numpy()
    # Spearman's rho of a Gaussian copula: (6/pi) asin(rho/2); margins stay as specified.
    assert abs(stats.spearmanr(inp, out).statistic - 6 / math.pi * math.asin(rho / 2)) < 0.01
    assert abs(np.median(inp) - 800) / 800 < 0.02
    ref = stats.truncpareto(1.5, 400, scale=20)
    ks = np.array([25, 50, 100, 500, 2000])
    assert np.allclose([(out <= k).mean() for k in ks], ref.cdf(ks + 0.5), atol=0.005)  # rounded to integers


@pytest.mark.parametrize("table,field,problem", [
    ({"dist": "pareto", "alpha": 1.0, "low": 100, "high": 50}, "high", "must be > 100"),
    ({"dist": "zipf", "s": 1.0}, "n", "missing required field"),
    ({"dist": "empirical", "values": [1, 2], "probs": [1.0]}, "probs", "has 1 entries"),
    ({"dist": "empirical", "quantiles": [[0.1, 5], [1.0, 9]]}, "quantiles", "from 0 to 1"),
    ({"dist": "mixture", "components": [{"weight": 1.0, "dist": "normal"}]}, "components[0].dist", "unknown value"),
    ({"dist": "lognormal", "median": 10, "mu": 2.0, "sigma": 1.0}, "mu", "not both"),
])
def test_bad_distribution_tables(table, field, problem):
    with pytest.raises(UserError) as info:
        dist(**table)
    assert f"tenants.t.input.{field}" in info.value.line() and problem in info.value.line(), info.value.line()
