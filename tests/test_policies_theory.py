"""Load-aware policies against queueing theory.

n identical FCFS servers with exponential service (rate 1) receive a Poisson
stream of rate n x lambda; the policy under test routes each arrival using
only the view a router has (in-flight counts). Mean time in system has
closed forms for the classic rules:

* random: every server is an M/M/1 queue, T = 1 / (1 - lambda);
* round robin: every server sees Erlang-n interarrivals, a GI/M/1 queue with
  T = 1 / (1 - sigma), sigma the root of sigma = (n lambda / (n lambda + 1 - sigma))^n;
* power of two choices: the supermarket model (Mitzenmacher 1996, Vvedenskaya
  et al. 1996), a fraction lambda^(2^k - 1) of servers holding k or more
  jobs as n grows, so T = sum_k lambda^(2^k - 2);
* join the shortest queue: almost no waiting at n = 50, T close to 1.
"""

from __future__ import annotations

import heapq
import random

import pytest
from scipy.optimize import brentq

from llmlb_bench.policies import RouteRequest, TargetInfo, View, make_policy
from llmlb_bench.policies.base import on_dispatch, on_finish, set_now

N, LAM = 50, 0.8


def mean_time_in_system(policy, n: int = N, lam: float = LAM, arrivals: int = 100_000, seed: int = 1) -> float:
    rng = random.Random(seed)
    view = View([TargetInfo(f"s{i}") for i in range(n)])
    last_departure = [0.0] * n
    departures: list[tuple[float, int, RouteRequest]] = []
    t = total = 0.0
    warmup = arrivals // 10
    for k in range(arrivals):
        t += rng.expovariate(n * lam)
        while departures and departures[0][0] <= t:
            _, i, done = heapq.heappop(departures)
            on_finish(view, i, done)
            policy.on_complete(done, i, view)
        set_now(view, t)
        r = RouteRequest(k, t, 1, 1)
        i = policy.choose(r, view)
        on_dispatch(view, i, r)
        last_departure[i] = max(t, last_departure[i]) + rng.expovariate(1.0)
        heapq.heappush(departures, (last_departure[i], i, r))
        if k >= warmup:
            total += last_departure[i] - t
    return total / (arrivals - warmup)


def test_random_routing_is_n_independent_mm1_queues():
    assert mean_time_in_system(make_policy("random", {"seed": 2})) == pytest.approx(1 / (1 - LAM), rel=0.08)


def test_round_robin_matches_the_erlang_n_gi_m_1_queue():
    sigma = brentq(lambda s: s - (N * LAM / (N * LAM + 1 - s)) ** N, 0.0, 1 - 1e-12)
    assert mean_time_in_system(make_policy("round_robin")) == pytest.approx(1 / (1 - sigma), rel=0.06)


def test_power_of_two_matches_the_supermarket_model():
    theory = sum(LAM ** (2**k - 2) for k in range(1, 12))  # 1.947 at lambda = 0.8
    measured = mean_time_in_system(make_policy("power_of_d", {"d": 2, "seed": 2}))
    assert measured == pytest.approx(theory, rel=0.08)
    assert measured < 0.45 / (1 - LAM)  # less than half of random routing's time in system


def test_join_the_shortest_queue_almost_never_waits():
    assert mean_time_in_system(make_policy("least_outstanding")) < 1.1
