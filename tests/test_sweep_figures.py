"""Knee, repeat intervals and capacity bisection on curves with known answers (no simulator)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from llmlb_bench.metrics.knee import kneedle
from llmlb_bench.sweep.stats import mean_ci


def test_kneedle_finds_the_corner_of_a_hockey_stick_exactly():
    xs = np.linspace(0, 10, 41)
    for k in (2.5, 5.0, 7.25):
        ys = 3.0 + np.maximum(0.0, xs - k) * 4.0
        assert kneedle(xs, ys) == pytest.approx(k)


@pytest.mark.parametrize("a, r", [(0.0, 0.9), (0.1, 0.9), (0.05, 0.95), (0.2, 0.8)])
def test_kneedle_of_the_mm1_curve_is_one_minus_the_geometric_mean_slack(a, r):
    xs = np.linspace(a, r, 2001)
    knee = kneedle(xs, 1.0 / (1.0 - xs))
    assert knee == pytest.approx(1 - math.sqrt((1 - a) * (1 - r)), abs=(r - a) / 2000)


def test_kneedle_is_scale_free_and_order_free():
    xs = np.linspace(0.1, 0.9, 17)
    ys = 1.0 / (1.0 - xs)
    perm = np.random.default_rng(0).permutation(len(xs))
    assert kneedle(xs[perm] * 40, 7 * ys[perm] + 3) == pytest.approx(40 * kneedle(xs, ys))


def test_kneedle_has_no_knee_on_a_line_a_concave_curve_or_too_few_points():
    xs = np.linspace(0, 1, 11)
    assert kneedle(xs, 2 * xs + 1) is None
    assert kneedle(xs, np.sqrt(xs)) is None
    assert kneedle(xs, np.ones_like(xs)) is None
    assert kneedle([0, 1], [0, 5]) is None
    assert kneedle([0, 1, 2, 3], [1, None, 1, 9]) == 2


def test_mean_ci_is_the_student_t_interval():
    values = [10.0, 12.0, 11.0, 15.0]
    ci = mean_ci(values)
    sem = np.std(values, ddof=1) / 2
    lo, hi = stats.t.interval(0.95, 3, loc=np.mean(values), scale=sem)
    assert (ci["mean"], ci["low"], ci["high"], ci["n"]) == pytest.approx((12.0, lo, hi, 4))


def test_mean_ci_skips_missing_values_and_gives_no_interval_from_one():
    assert mean_ci([None, 3.0]) == {"mean": 3.0, "low": None, "high": None, "n": 1}
    assert mean_ci([None]) == {"mean": None, "low": None, "high": None, "n": 0}


def test_interval_covers_the_true_mean_at_its_nominal_rate():
    rng = np.random.default_rng(5)
    hits = 0
    for _ in range(2000):
        ci = mean_ci(list(rng.normal(1.0, 0.3, 3)))
        hits += ci["low"] <= 1.0 <= ci["high"]
    assert hits / 2000 == pytest.approx(0.95, abs=0.015)
