"""The simulator against queueing theory.

With ``max_num_seqs = 1`` and fixed lengths a replica serves one request at a
time in a fixed time D, so under Poisson arrivals it is an M/D/1 queue:
its waits follow the Lindley recursion exactly, and their mean is
Pollaczek-Khinchine's  Wq = rho * D / (2 (1 - rho)).
With geometric output lengths (the discrete exponential) and a one-token
prompt the service time is nearly exponential (squared coefficient of
variation 0.99): an M/M/1 queue, checked with the general P-K formula
Wq = lambda E[S^2] / (2 (1 - rho)) on the service times the cost model gives.
With c replicas behind a router-side FCFS queue that releases a request
whenever a replica is free, the cluster is M/M/c, and the mean wait is
Erlang C's; join-shortest-queue (no central queue) waits longer than that,
but much less than c separate M/M/1 queues (random routing).

Sampling noise: near saturation the sample mean of 10^5 waits still
fluctuates by a few percent (at rho = 0.9 the standard deviation of the
estimate is about 3.5%), so the slow test averages independent runs until
three standard errors fit inside the 2% band; the fast tests check the exact
recursion at high load and the mean at rho = 0.5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmlb_bench.policies import make_policy
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.fleet import cost_model
from llmlb_bench.sim import simulate
from llmlb_bench.store import RunStore
from sim_helpers import by_request_id, run_sim, trace

MD1 = ClusterConfig.build(replicas=1, max_num_seqs=1)
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


# ---- exponential service: M/M/1 and M/M/c ------------------------------------------------------------

MEAN_OUT = 100


def _service_times(cfg: ClusterConfig) -> np.ndarray:
    """Service time of a lone 1-token-prompt request by output length, from the cost model."""
    cost = cost_model(cfg.pools[0])
    prefill = cost.step(1, 1.0, 1, 0, 0, 1).total
    decode = [cost.decode_time(1, j + 2) for j in range(3000)]
    return np.concatenate([[0.0], prefill + np.concatenate([[0.0], np.cumsum(decode)])[:2999]])


def _exponential_lengths(n: int, seed: int) -> np.ndarray:
    return np.minimum(np.random.default_rng(seed).geometric(1 / MEAN_OUT, n), 2999)


def test_mm1_mean_wait_matches_pollaczek_khinchine(tmp_path):
    cfg = ClusterConfig.build(replicas=1, max_num_seqs=1)
    out = _exponential_lengths(50_000, seed=1)
    s = _service_times(cfg)[out]
    rho = 0.5
    arrival = _poisson(len(out), s.mean() / rho, seed=2)
    req = by_request_id(run_sim(tmp_path, trace(arrival, 1, out), cfg, policy="round_robin")[0])
    waits = req.column("last_token_s").to_numpy() - arrival - s
    assert waits.min() > -1e-6
    lam = rho / s.mean()
    assert s.var() / s.mean() ** 2 == pytest.approx(1.0, abs=0.02), "nearly exponential service"
    assert waits.mean() == pytest.approx(lam * (s ** 2).mean() / (2 * (1 - rho)), rel=0.02)


def _erlang_c_wait(c: int, rho: float, mean_s: float) -> float:
    a = c * rho
    top = a ** c / math.factorial(c) / (1 - rho)
    p_wait = top / (sum(a ** k / math.factorial(k) for k in range(c)) + top)
    return p_wait * mean_s / (c * (1 - rho))


def _cluster_waits(tmp_path, policy: str, args: dict, c: int, rho: float, n: int, seed: int,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival, service, wait) per request of a c-replica cluster at load rho."""
    cfg = ClusterConfig.build(replicas=c, max_num_seqs=1)
    out = _exponential_lengths(n, seed=seed)
    s = _service_times(cfg)[out]
    arrival = _poisson(n, s.mean() / (c * rho), seed=seed + 1000)
    with RunStore(tmp_path, config={}, backend="sim", run_id=f"{policy}-{seed}") as run:
        simulate(trace(arrival, 1, out), cfg, make_policy(policy, args), run)
    import pyarrow.parquet as pq

    req = by_request_id(pq.read_table(run.dir / "requests.parquet"))
    return arrival, s, req.column("last_token_s").to_numpy() - arrival - s


def test_central_fcfs_queue_waits_follow_the_kiefer_wolfowitz_recursion(tmp_path):
    """FCFS with c servers: each request starts when it arrives or when the earliest server frees."""
    c = 4
    arrival, s, waits = _cluster_waits(tmp_path, "fcfs_queue", {"max_outstanding": 1}, c, 0.8, 20_000, seed=3)
    free = [0.0] * c
    expected = np.empty_like(arrival)
    for i, (a, d) in enumerate(zip(arrival, s)):
        k = min(range(c), key=free.__getitem__)
        start = max(a, free[k])
        expected[i] = start - a
        free[k] = start + d
    np.testing.assert_allclose(waits, expected, atol=1e-6)   # service times from the cost model: to 1 us


@pytest.mark.slow
def test_central_fcfs_queue_mean_wait_is_erlang_c(tmp_path):
    c, rho = 4, 0.7
    runs = [_cluster_waits(tmp_path, "fcfs_queue", {"max_outstanding": 1}, c, rho, 50_000, seed=s) for s in range(8)]
    wait = np.mean([w.mean() for _, _, w in runs])
    mean_s = np.mean([s.mean() for _, s, _ in runs])
    assert wait == pytest.approx(_erlang_c_wait(c, rho, mean_s), rel=0.02)


@pytest.mark.slow
def test_jsq_lies_between_mmc_and_separate_queues(tmp_path):
    c, rho = 4, 0.7
    _, s, jsq = _cluster_waits(tmp_path, "least_outstanding", {}, c, rho, 40_000, seed=5)
    _, _, rand = _cluster_waits(tmp_path, "random", {}, c, rho, 40_000, seed=5)
    erlang = _erlang_c_wait(c, rho, s.mean())
    mm1 = rho * s.mean() / (1 - rho)          # M/M/1 per server under random splitting
    assert erlang < jsq.mean() < 0.5 * mm1
    assert rand.mean() == pytest.approx(mm1, rel=0.1)
