"""The simulator against queueing theory.

With ``max_num_seqs = 1`` and fixed lengths a replica serves one request at a
time in a fixed time D, so under Poisson arrivals it is an M/D/1 queue:
its waits follow the Lindley recursion exactly, and their mean is
Pollaczek-Khinchine's  Wq = rho * D / (2 (1 - rho)).

Sampling noise: near saturation the sample mean of 10^5 waits still
fluctuates by a few percent (at rho = 0.9 the standard deviation of the
estimate is about 3.5%), so the slow test averages independent runs until
three standard errors fit inside the 2% band; the fast tests check the exact
recursion at high load and the mean at rho = 0.5.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmlb_bench.sim import ClusterConfig
from sim_helpers import by_request_id, run_sim, trace

MD1 = ClusterConfig(replicas=1, max_num_seqs=1)
PROMPT, OUTPUT = 100, 10


def _service_time(tmp_path) -> float:
    req = run_sim(tmp_path, trace(np.array([0.0]), PROMPT, OUTPUT), MD1, run_id="single")[0]
    return req.column("last_token_s")[0].as_py()


def _poisson(n: int, mean_gap: float, seed: int) -> np.ndarray:
    """Poisson arrivals whose empirical rate equals the nominal one (the dominant noise term of the mean wait)."""
    gaps = np.random.default_rng(seed).exponential(1.0, n)
    return np.cumsum(gaps / gaps.mean() * mean_gap)


def _waits(tmp_path, arrival: np.ndarray, d: float, run_id: str) -> np.ndarray:
    req = by_request_id(run_sim(tmp_path, trace(arrival, PROMPT, OUTPUT), MD1, policy="round_robin",
                                run_id=run_id)[0])
    return req.column("last_token_s").to_numpy() - req.column("sent_s").to_numpy() - d


def _pollaczek_khinchine(rho: float, d: float) -> float:
    return rho * d / (2 * (1 - rho))


def test_md1_waits_follow_the_lindley_recursion_exactly(tmp_path):
    d = _service_time(tmp_path)
    arrival = _poisson(20_000, d / 0.9, seed=1)
    waits = _waits(tmp_path, arrival, d, "lindley")
    expected = np.zeros_like(arrival)
    gaps = np.diff(arrival)
    for i in range(1, len(arrival)):
        expected[i] = max(0.0, expected[i - 1] + d - gaps[i - 1])
    np.testing.assert_allclose(waits, expected, atol=1e-9)


def test_md1_mean_wait_matches_pollaczek_khinchine(tmp_path):
    d = _service_time(tmp_path)
    waits = _waits(tmp_path, _poisson(100_000, d / 0.5, seed=0), d, "md1")
    assert waits.mean() == pytest.approx(_pollaczek_khinchine(0.5, d), rel=0.02)


@pytest.mark.slow
@pytest.mark.parametrize("rho, runs", [(0.5, 1), (0.8, 4), (0.9, 12)])
def test_md1_mean_wait_at_high_load(tmp_path, rho, runs):
    d = _service_time(tmp_path)
    means = [_waits(tmp_path, _poisson(100_000, d / rho, seed=s), d, f"md1-{rho}-{s}").mean() for s in range(runs)]
    assert np.mean(means) == pytest.approx(_pollaczek_khinchine(rho, d), rel=0.02)
