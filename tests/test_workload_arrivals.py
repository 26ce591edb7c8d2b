"""Every arrival process against its theory: rate, inter-arrival CV, KS, index of dispersion."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from llmlb_bench.errors import UserError
from llmlb_bench.schema import write_trace
from llmlb_bench.workload.arrivals import parse_arrival, weibull_shape
from llmlb_bench.workload.fields import Section
from llmlb_bench.workload.stats import index_of_dispersion


def process(source="spec.toml", **table):
    return parse_arrival(Section(table, "tenants.t.arrival", source))


def draw(proc, horizon, seed=0, rate_scale=1.0):
    return proc.times(np.random.default_rng(seed), horizon, rate_scale)


@pytest.mark.parametrize("family,cv", [("gamma", 0.5), ("gamma", 2.0), ("weibull", 0.7), ("weibull", 1.8)])
def test_renewal_rate_cv_and_distribution(family, cv):
    t = draw(process(process=family, rate=20.0, cv=cv), 100_000 / 20.0)
    gaps = np.diff(t)
    assert abs(len(t) / 5000.0 - 20.0) / 20.0 < 0.03
    assert abs(gaps.std() / gaps.mean() - cv) / cv < 0.05
    if family == "gamma":
        k = 1 / cv**2
        ref = stats.gamma(k, scale=1 / (20.0 * k))
    else:
        k = weibull_shape(cv)
        ref = stats.weibull_min(k, scale=1 / (20.0 * math.exp(special.gammaln(1 + 1 / k))))
    assert stats.kstest(gaps, ref.cdf).pvalue > 0.01


def test_weibull_shape_inverts_cv():
    for cv in (0.3, 1.0, 2.5):
        k = weibull_shape(cv)
        m1, m2 = special.gamma(1 + 1 / k), special.gamma(1 + 2 / k)
        assert math.isclose(math.sqrt(m2 / m1**2 - 1), cv, rel_tol=1e-9)
    assert math.isclose(weibull_shape(1.0), 1.0, rel_tol=1e-9)


def test_renewal_index_of_dispersion_is_cv_squared():
    # For a renewal process the IDC tends to CV^2 at long windows.
    t = draw(process(process="gamma", rate=50.0, cv=2.0), 4000.0)
    assert 3.0 < index_of_dispersion(t, 20.0) < 5.0


def test_diurnal_modulation_follows_the_rate_curve():
    proc = process(process="poisson", rate=20.0,
                   modulation={"shape": "diurnal", "period_s": 1000.0, "amplitude": 0.8, "peak_s": 250.0})
    t = draw(proc, 10_000.0)
    assert abs(len(t) / 10_000.0 - 20.0) < 0.5
    phase = np.histogram(t % 1000.0, bins=10, range=(0, 1000))[0] / (10 * 100.0)
    centres = np.arange(10) * 100 + 50
    # mean of the cosine over a bin of a tenth of the period: cos(centre) * sinc(0.1)
    expected = 20.0 * (1 + 0.8 * np.cos(2 * np.pi * (centres - 250) / 1000) * np.sinc(0.1))
    assert np.allclose(phase, expected, rtol=0.06)
    # time rescaling: the rescaled gaps are unit exponential
    lam = 20.0 * proc.modulation.cumulative(t)
    assert stats.kstest(np.diff(lam), "expon").pvalue > 0.01


def test_piecewise_and_ramp():
    proc = process(process="poisson", rate=100.0, modulation={"shape": "piecewise", "at_s": [0, 100, 300],
                                                              "factor": [1.0, 0.0, 0.5]})
    t = draw(proc, 1000.0)
    counts = np.histogram(t, bins=[0, 100, 300, 1000])[0]
    assert abs(counts[0] - 10_000) < 400 and counts[1] == 0 and abs(counts[2] - 35_000) < 800
    ramp = process(process="poisson", rate=100.0, modulation={"shape": "ramp", "from": 0.0, "to": 2.0,
                                                              "start_s": 0, "end_s": 1000})
    t = draw(ramp, 1000.0)
    counts = np.histogram(t, bins=4, range=(0, 1000))[0]
    assert np.allclose(counts, [6_250, 18_750, 31_250, 43_750], rtol=0.04)


def mmpp_idc_theory(l1, l2, m1, m2, window):
    a, b = 1 / m1, 1 / m2
    p1, p2 = b / (a + b), a / (a + b)
    mean = p1 * l1 + p2 * l2
    tau = 1 / (a + b)
    return mean, 1 + 2 * p1 * p2 * (l1 - l2) ** 2 * tau / mean * (1 - tau / window * (1 - math.exp(-window / tau)))


def test_mmpp_rate_and_dispersion_match_theory():
    proc = process(process="mmpp", states=[{"rate": 5.0, "mean_s": 10.0}, {"rate": 50.0, "mean_s": 10.0}])
    horizon = 20_000.0
    t = draw(proc, horizon)
    mean, _ = mmpp_idc_theory(5, 50, 10, 10, 1)
    assert abs(len(t) / horizon - mean) / mean < 0.05
    idc = {w: index_of_dispersion(t, w, 0, horizon) for w in (0.1, 1.0, 10.0, 100.0)}
    assert 1.0 < idc[0.1] < idc[1.0] < idc[10.0] < idc[100.0]
    for w in (1.0, 10.0):
        assert abs(idc[w] - mmpp_idc_theory(5, 50, 10, 10, w)[1]) / idc[w] < 0.25


def test_mmpp_transition_matrix_and_off_state():
    proc = process(process="mmpp", states=[{"rate": 0.0, "mean_s": 5.0}, {"rate": 10.0, "mean_s": 5.0},
                                           {"rate": 40.0, "mean_s": 2.0}],
                   transitions=[[0, 1, 0], [0.5, 0, 0.5], [1, 0, 0]])
    pi = proc.stationary()
    # embedded chain: nu = (1/3+, ...); solve by hand: nu0 = nu1/2 + nu2, nu1 = nu0, nu2 = nu1/2
    nu = np.array([1.0, 1.0, 0.5])
    ref = nu * np.array([5, 5, 2]) / (nu * np.array([5, 5, 2])).sum()
    assert np.allclose(pi, ref)
    t = draw(proc, 20_000.0)
    assert abs(len(t) / 20_000.0 - ref @ [0, 10, 40]) / (ref @ [0, 10, 40]) < 0.05


def test_hawkes_rate_and_dispersion():
    proc = process(process="hawkes", rate=20.0, branching=0.5, decay_s=1.0)
    horizon = 5000.0
    t = draw(proc, horizon)
    assert abs(len(t) / horizon - 20.0) / 20.0 < 0.05
    idc = [index_of_dispersion(t, w, 0, horizon) for w in (0.1, 1.0, 10.0, 50.0)]
    assert 1.0 < idc[0] < idc[1] < idc[2]
    assert abs(idc[3] - 1 / (1 - 0.5) ** 2) / 4.0 < 0.3  # long windows: IDC -> 1/(1-n)^2


def test_windows_follow_their_table():
    proc = process(process="windows", window_s=500.0, rate=[10.0, 0.0, 40.0], cv=[2.0, 1.0, 0.5],
                   family=["gamma", "poisson", "weibull"])
    assert proc.horizon_limit(1.0) == 1500.0
    t = draw(proc, 10_000.0)
    counts = np.histogram(t, bins=[0, 500, 1000, 1500])[0]
    assert abs(counts[0] - 5000) < 500 and counts[1] == 0 and abs(counts[2] - 20_000) < 600
    late = np.diff(t[t >= 1000])
    assert abs(late.std() / late.mean() - 0.5) < 0.05


def test_replay_timestamps(tmp_path):
    from llmlb_bench.schema import TRACE
    import pyarrow as pa

    times = np.sort(np.random.default_rng(1).uniform(0, 100, 500))
    table = TRACE.conform(pa.table({"request_id": np.arange(500), "arrival_s": times,
                                    "input_tokens": np.full(500, 5, np.int32),
                                    "output_tokens": np.full(500, 5, np.int32)}), "x")
    write_trace(table, tmp_path / "src.parquet")
    proc = process(source=str(tmp_path / "spec.toml"), process="replay", path="src.parquet")
    assert np.array_equal(draw(proc, 1000.0), times)
    assert np.allclose(draw(proc, 1000.0, rate_scale=2.0), times / 2)
    assert len(draw(proc, 50.0)) == int((times < 50).sum())
    assert np.array_equal(draw(process(process="replay", times_s=[0, 1.5, 3]), 10.0), [0, 1.5, 3])


@pytest.mark.parametrize("table,field", [
    ({"process": "mmpp", "states": [{"rate": 1.0, "mean_s": 1.0}]}, "states"),
    ({"process": "mmpp", "states": [{"rate": 1.0, "mean_s": 1.0}, {"rate": 2.0, "mean_s": -1.0}]}, "states[1].mean_s"),
    ({"process": "hawkes", "rate": 1.0, "branching": 1.2, "decay_s": 1.0}, "branching"),
    ({"process": "windows", "window_s": 60.0, "rate": [1.0, 2.0], "cv": [1.0]}, "cv"),
    ({"process": "gamma", "rate": 1.0}, "cv"),
    ({"process": "poisson", "rate": 1.0, "modulation": {"shape": "sawtooth"}}, "modulation.shape"),
    ({"process": "replay", "path": "absent.parquet"}, None),
])
def test_bad_arrival_tables(table, field):
    with pytest.raises(UserError) as info:
        process(**table)
    line = info.value.line()
    if field:
        assert f"tenants.t.arrival.{field}" in line, line
    else:
        assert "absent.parquet" in line and "no such file" in line
