"""Capacity search and knee against the M/M/1 queue, through whole sweeps on the simulator.

One replica with ``max_num_seqs = 1`` serves one request at a time; with a
16-token prompt and exponentially distributed output lengths (mean 50) its
service time is one engine step per token, so close to exponential (the
measured squared coefficient of variation is 1.00). Under Poisson arrivals
that is an M/M/1 queue with service rate mu = 1 / E[S], where the time in
system T is exponential with rate mu - lambda:

* capacity: P(T <= x) = 1 - exp(-(mu - lambda) x) reaches the target alpha at
  lambda* = mu - ln(1 / (1 - alpha)) / x. With x = 5 E[S] and alpha = 0.9,
  lambda* = 0.54 mu;
* knee: mean T = 1 / (mu - lambda), whose Kneedle knee over loads [a, r] is
  at rho = 1 - sqrt((1 - a)(1 - r)): 0.6 for a = 0.2, r = 0.8.

mu is measured, not assumed: in a single FCFS server a request's service
starts at its arrival or at the previous departure, whichever is later, so
every service time is read exactly off one stored run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from llmlb_bench.sweep import make_executor, parse_sweep, run_sweep

pytestmark = pytest.mark.slow

WORKLOAD = """
seed = 1
requests = 10000
[tenants.mm1]
arrival = { process = "poisson", rate = 1.0 }
input = { dist = "fixed", value = 16 }
output = { dist = "exponential", mean = 50 }
"""
SERVER = {"replicas": 1, "max_num_seqs": 1, "enable_prefix_caching": False, "series_interval_s": 60.0}


def _sweep(base: Path, name: str, **extra):
    data = {"name": name, "workloads": {"mm1": "mm1.toml"}, "clusters": {"one": SERVER},
            "policies": {"round_robin": {}}, **extra}
    return parse_sweep(data, name, base)


@pytest.fixture(scope="module")
def mm1(tmp_path_factory):
    base = tmp_path_factory.mktemp("mm1")
    (base / "mm1.toml").write_text(WORKLOAD)
    with make_executor("local", 2) as ex:
        out = run_sweep(_sweep(base, "service", load={"rate_scale": [0.1]}), base / "results", ex)
    req = pq.read_table(out.root / out.cells[0].run_id / "requests.parquet").sort_by("sent_s")
    sent, end = req["sent_s"].to_numpy(), req["last_token_s"].to_numpy()
    start = np.maximum(sent, np.concatenate([[0.0], end[:-1]]))
    service = end - start
    assert service.var() / service.mean() ** 2 == pytest.approx(1.0, abs=0.05)  # exponential-like
    return base, 1.0 / service.mean()


def test_capacity_search_finds_the_mm1_rate_that_meets_the_sojourn_slo(mm1):
    base, mu = mm1
    x, alpha = 5.0 / mu, 0.9
    theory = mu - math.log(1 / (1 - alpha)) / x
    spec = _sweep(base, "capacity", slo=f"e2e={x:.6f}s", seeds=[1, 2, 3, 4], attainment=alpha,
                  capacity={"rate": [0.1 * mu, 0.95 * mu], "tolerance": 0.01})
    with make_executor("local", 2) as ex:
        cap = run_sweep(spec, base / "results", ex).capacity[0]
    assert cap["n"] == 4 and not cap["censored"]
    assert cap["low"] <= theory <= cap["high"]
    assert cap["mean"] == pytest.approx(theory, rel=0.05)
    for seed in cap["per_seed"]:  # bisection stopped within tolerance, with the target between its ends
        lo, hi = seed["bracket"]
        assert hi / lo <= 1.01
        met = {e["rate"]: e["attainment"] >= alpha for e in seed["evaluations"]}
        assert met[lo] and not met[hi]


def test_knee_of_the_simulated_mm1_curve_is_where_theory_puts_it(mm1):
    base, mu = mm1
    rhos = np.round(np.arange(0.2, 0.801, 0.05), 2)
    spec = _sweep(base, "knee", seeds=[1, 2], load={"rate": [float(r * mu) for r in rhos]})
    with make_executor("local", 2) as ex:
        curve = run_sweep(spec, base / "results", ex).curves[0]
    mean_t = np.array([p["e2e.mean"]["mean"] for p in curve["points"]])
    np.testing.assert_allclose(mean_t * mu, 1 / (1 - rhos), rtol=0.06)  # the curve itself is M/M/1
    assert curve["knee"]["x"] / mu == pytest.approx(1 - math.sqrt(0.8 * 0.2), abs=0.051)
