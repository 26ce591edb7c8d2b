"""Percentiles of weighted samples and their bootstrap intervals, against NumPy, GuideLLM's rule and brute force."""

from __future__ import annotations

import numpy as np
import pytest

from llmlb_bench.metrics.distribution import (PERCENTILES, Sample, bootstrap_ci, describe, percentile, pkey, rng_for,
                                              sample_of)


def bands(values, weights=None):
    return sample_of(np.asarray(values, float), weights)


def guidellm_percentile(values, weights, q):
    """GuideLLM's rule (``Percentiles.from_pdf``): first value whose cumulative probability reaches q."""
    order = np.argsort(values)
    v, p = np.asarray(values)[order], np.asarray(weights, float)[order]
    cdf = np.cumsum(p / p.sum())
    return v[np.searchsorted(cdf, q, side="left")]


def test_linear_percentiles_match_numpy_on_expanded_weights():
    rng = np.random.default_rng(7)
    values = rng.lognormal(0, 1, 3000)
    weights = rng.integers(1, 40, 3000)
    band = bands(values, weights)
    expanded = np.repeat(values, weights)
    assert band.n == len(expanded) and band.mean == pytest.approx(expanded.mean())
    for p in PERCENTILES:
        assert percentile(band, p, "linear") == pytest.approx(np.percentile(expanded, p), abs=1e-12)


def test_inverse_cdf_percentiles_match_guidellm():
    rng = np.random.default_rng(8)
    values = rng.exponential(1.0, 500)
    weights = rng.integers(1, 9, 500)
    band = bands(values, weights)
    for p in PERCENTILES:
        assert percentile(band, p, "inverse_cdf") == guidellm_percentile(values, weights, p / 100)


def test_percentiles_of_a_tiny_hand_sample():
    band = bands([4.0, 1.0, 3.0, 2.0])
    assert percentile(band, 50, "linear") == 2.5            # halfway between 2 and 3
    assert percentile(band, 50, "inverse_cdf") == 2.0       # cdf reaches 0.5 at 2
    assert percentile(band, 99.9, "linear") == pytest.approx(3.997)


def test_bootstrap_interval_equals_brute_force_resampling():
    """The order-statistic shortcut draws from the same distribution as resampling N values."""
    rng = np.random.default_rng(11)
    values = np.round(rng.lognormal(0, 0.8, 400), 3)
    band = bands(values)
    brute_rng = np.random.default_rng(12)
    for p, method in ((50, "linear"), (90, "linear"), (99, "linear"), (90, "inverse_cdf")):
        resamples = brute_rng.choice(values, size=(20000, len(values)), replace=True)
        if method == "linear":
            stats = np.percentile(resamples, p, axis=1)
        else:
            stats = np.sort(resamples, axis=1)[:, int(np.ceil(p / 100 * len(values))) - 1]
        want = np.quantile(stats, [0.025, 0.975])
        got = bootstrap_ci(band, p, method, np.random.default_rng(13), replicates=20000)
        spread = np.quantile(stats, 0.9) - np.quantile(stats, 0.1)
        assert got[0] == pytest.approx(want[0], abs=0.1 * spread), (p, method)
        assert got[1] == pytest.approx(want[1], abs=0.1 * spread), (p, method)
        assert got[0] <= percentile(band, p, method) <= got[1]


def test_bootstrap_is_seeded_by_run_and_figure_not_by_order():
    band = bands(np.arange(100.0))
    a = describe(band, "linear", seed=3, key=("run-a", "ttft"))
    b = describe(band, "linear", seed=3, key=("run-a", "ttft"))
    c = describe(band, "linear", seed=4, key=("run-a", "ttft"))
    assert a == b and a["ci"] != c["ci"]
    assert set(a["ci"]) == {pkey(p) for p in PERCENTILES} == {"p50", "p90", "p95", "p99", "p99.9"}
    assert rng_for(1, "x").random() == rng_for(1, "x").random()


def test_empty_and_single_value():
    assert describe(None, "linear", seed=0, key=("r", "ttft"))["p50"] is None
    one = Sample(v=np.array([2.0]), cw=np.array([1]), n=1, mean=2.0)
    d = describe(one, "linear", seed=0, key=("r", "x"))
    assert d["p99.9"] == 2.0 and d["ci"]["p50"] == [2.0, 2.0]


def test_nulls_and_zero_weights_are_dropped():
    s = sample_of(np.array([3.0, np.nan, 1.0, 2.0]), np.array([1.0, 5.0, 0.0, np.nan]))
    assert (s.v.tolist(), s.n) == ([3.0], 1)
    assert sample_of(np.array([np.nan])) is None


def test_zero_negative_and_clustered_values():
    """Ties, zeros, negatives and values a millionth apart keep exact ranks."""
    rng = np.random.default_rng(2)
    values = np.r_[np.zeros(300), -np.ones(5), 1.0 + rng.uniform(0, 1e-6, 2000), rng.lognormal(0, 2, 2000)]
    weights = rng.integers(1, 5, len(values))
    band = bands(values, weights)
    expanded = np.repeat(values, weights)
    for p in PERCENTILES:
        assert percentile(band, p, "linear") == pytest.approx(np.percentile(expanded, p), abs=1e-12)


@pytest.mark.parametrize("top,distinct", [(300, 50), (2 ** 20, 50), (2 ** 52, 5000)])
def test_weighted_sample_is_sorted_as_lexsort_sorts_it(top, distinct):
    """sample_of's packed sort of (value rank, weight), or its two stable sorts where a weight and a
    rank do not fit in one word (2^52 and 13 bits), give np.lexsort((w, v))'s order exactly: ties of
    value ordered by weight, so the mean's sum runs in the same order."""
    rng = np.random.default_rng(top)
    v = rng.choice(rng.uniform(0, 1, distinct), 5000)     # ties
    w = rng.integers(1, min(top, 300), 5000)
    w[:3] = top - 1
    s = sample_of(v, w)
    order = np.lexsort((w, v))
    assert (s.v == v[order]).all() and (s.cw == np.cumsum(w[order])).all()
    assert s.mean == float((v[order] * w[order]).sum() / w.sum())


@pytest.mark.parametrize("distinct", [1, 40, 3000])
def test_pairs_sorted_with_positions_is_a_stable_argsort(distinct: int) -> None:
    """pairs_sorted(v, positions) returns, as its weights, np.argsort(v, kind="stable"): ties, -0.0
    beside 0.0 and negative values included."""
    from llmlb_bench.metrics.distribution import pairs_sorted

    rng = np.random.default_rng(distinct)
    v = rng.choice(np.r_[rng.uniform(-1, 1, distinct), 0.0, -0.0], 20_000)
    _, order = pairs_sorted(v, np.arange(len(v)))
    assert order.tobytes() == np.argsort(v, kind="stable").astype(np.int64).tobytes()


@pytest.mark.parametrize("case", ["split", "zeros", "nan", "only_ones", "no_ones", "unit_pairs", "empty"])
def test_sample_of_parts_is_the_sample_of_the_concatenation(case: str) -> None:
    """sample_of_parts(v, w, ones) equals sample_of(v + ones, w + [1, ...]) to the last bit: values,
    cumulative weights, count and mean, taking the split or the general way (zeros, only one kind,
    NaN and zero weights dropped, weight-1 pairs among the weighted ones, nothing left)."""
    from llmlb_bench.metrics.distribution import sample_of_parts

    rng = np.random.default_rng(len(case))
    pool = rng.uniform(0.001, 0.2, 300)
    v, w = rng.choice(pool, 4000), rng.integers(2, 40, 4000)
    ones = rng.choice(pool, 9000)
    if case == "zeros":
        ones[::50] = 0.0
    elif case == "nan":
        v[::7], ones[::11], w[::13] = np.nan, np.nan, 0
    elif case == "only_ones":
        v, w = v[:0], w[:0]
    elif case == "no_ones":
        ones = ones[:0]
    elif case == "unit_pairs":
        w[::3] = 1
    elif case == "empty":
        v, w, ones = v[:3] * np.nan, w[:3], ones[:0]
    want = sample_of(np.concatenate([v, ones]), np.concatenate([w, np.ones(len(ones), dtype=np.int64)]))
    got = sample_of_parts(v, w, ones.copy())
    if want is None:
        assert got is None
        return
    assert got is not None and got.n == want.n and got.mean == want.mean
    assert got.v.tobytes() == want.v.tobytes() and got.cw is not None and want.cw is not None
    assert got.cw.tobytes() == want.cw.tobytes()


def test_weighted_ranks_are_searched_as_integers_with_the_same_indices() -> None:
    """A weighted sample's order statistics at whole ranks held as doubles (the bootstrap's ceil(u * n) - 1)
    are searched among the cumulative weights as integers: the indices of the search of doubles, at the
    ends too (u of 0 and 1), and ranks that are not whole, NaN or huge still search as doubles."""
    rng = np.random.default_rng(5)
    w = rng.integers(1, 50, 20_000)
    s = Sample(v=np.sort(rng.normal(0, 1, len(w))), cw=np.cumsum(w), n=int(w.sum()), mean=0.0)
    for u in (rng.beta(200, 300, 2000), rng.random(2000), np.array([0.0, 1.0, 1e-12, 1 - 1e-12])):
        ranks = np.ceil(u * s.n) - 1
        assert ranks.dtype == np.float64
        ref = s.v[np.clip(np.searchsorted(s.cw.astype(np.float64), ranks + 1), 0, len(s.v) - 1)]
        assert s.quantile_at(u).tobytes() == ref.tobytes()
        assert s.at_rank(ranks).tobytes() == ref.tobytes()
    for odd in (np.array([0.5, 10.25, 3e3]), np.array([np.nan, 4.0]), np.array([1e300, 2.0]), np.array([-1e300])):
        ref = s.v[np.clip(np.searchsorted(s.cw, odd + 1), 0, len(s.v) - 1)]
        assert s.at_rank(odd).tobytes() == ref.tobytes()
