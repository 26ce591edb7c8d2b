"""Latency counts from arrival where the router is part of the system under test (metrics.origin).

A router-side FCFS queue in front of c single-slot replicas with Poisson
arrivals and nearly exponential service is an M/M/c queue: a request waits
at the router with Erlang C's probability, for Erlang C's mean wait. The
report must show that wait in TTFT and E2E (counted from arrival), and as
its own figure (router wait), instead of counting from the moment the router
released the request. In a replay the same gap is the client's lag: kept
out of latency, reported and flagged.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from llmlb_bench.metrics.origin import ARRIVAL, SENT, holds_requests, latency_from
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.policies import make_policy
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from llmlb_bench.store.views import Catalog
from metrics_helpers import store_run, timed_requests
from sim_helpers import by_request_id, trace
from test_sim_queueing import _erlang_c_wait, _exponential_lengths, _poisson, _service_times


def _erlang_c_probability(c: int, rho: float) -> float:
    a = c * rho
    top = a ** c / math.factorial(c) / (1 - rho)
    return top / (sum(a ** k / math.factorial(k) for k in range(c)) + top)


def _mmc_run(tmp_path, c: int, rho: float, n: int, seed: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """Simulate M/M/c behind fcfs_queue; (summary, arrival, service) per request."""
    cfg = ClusterConfig.build(replicas=c, max_num_seqs=1)
    out = _exponential_lengths(n, seed=seed)
    s = _service_times(cfg)[out]
    arrival = _poisson(n, s.mean() / (c * rho), seed=seed + 1000)
    run_id = f"mm{c}-{seed}"
    with RunStore(tmp_path, config={"cluster": cfg.to_dict(), "policy": {"name": "fcfs_queue"}}, backend="sim",
                  run_id=run_id) as run:
        simulate(trace(arrival, 1, out), cfg, make_policy("fcfs_queue", {"max_outstanding": 1}), run)
    summary = summarize(Catalog([tmp_path / run_id]), Slo.parse("ttft=1s"), Options(ci=False))[0]
    return summary, arrival, s


def test_router_wait_of_mm4_at_rho_09_shows_in_ttft_and_as_its_own_figure(tmp_path):
    c, rho = 4, 0.9
    summary, arrival, s = _mmc_run(tmp_path, c, rho, 40_000, seed=7)
    req = by_request_id(pq.read_table(tmp_path / "mm4-7" / "requests.parquet"))
    first = req.column("first_token_s").to_numpy()
    sent = req.column("sent_s").to_numpy()
    assert summary["latency_from"] == ARRIVAL
    # every figure counts from arrival, to the last bit of the rows
    assert summary["ttft"]["mean"] == pytest.approx((first - arrival).mean(), rel=1e-9)
    assert summary["wait"]["kind"] == "router" and summary["wait"]["included"]
    assert summary["wait"]["mean"] == pytest.approx((sent - arrival).mean(), rel=1e-9)
    # ... and that is M/M/4's wait: Erlang C's probability of waiting and mean wait
    # (one run of 40k requests at rho = 0.9: a few percent of sampling noise, so 12% bands;
    # the slow test below averages runs to 3%)
    mean_s = s.mean()
    assert summary["wait"]["share"] == pytest.approx(_erlang_c_probability(c, rho), rel=0.12)
    assert summary["wait"]["mean"] == pytest.approx(_erlang_c_wait(c, rho, mean_s), rel=0.12)
    # the wait dominates TTFT: counted from the release TTFT would be the prefill of one token
    assert summary["ttft"]["mean"] > 50 * (first - sent).mean()
    # attainment is judged from arrival too: a 1 s TTFT limit fails every request that waited longer
    assert summary["slo"]["attainment"] == pytest.approx(((first - arrival) <= 1.0).mean(), abs=1e-12)


@pytest.mark.slow
def test_mean_router_wait_of_mm4_at_rho_09_is_erlang_c(tmp_path):
    c, rho = 4, 0.9
    runs = [_mmc_run(tmp_path, c, rho, 60_000, seed=s) for s in range(8)]
    wait = np.mean([r[0]["wait"]["mean"] for r in runs])
    mean_s = np.mean([r[2].mean() for r in runs])
    assert wait == pytest.approx(_erlang_c_wait(c, rho, mean_s), rel=0.03)
    share = np.mean([r[0]["wait"]["share"] for r in runs])
    assert share == pytest.approx(_erlang_c_probability(c, rho), rel=0.03)


def _replay_run(tmp_path, run_id: str, policy: str, lag: float):
    rows = [{"sent_s": i * 1.0 + lag, "scheduled_s": i * 1.0, "first_token_s": i * 1.0 + lag + 0.1,
             "last_token_s": i * 1.0 + lag + 0.5, "output_tokens": 5} for i in range(20)]
    return store_run(tmp_path, run_id, timed_requests(rows), backend="replay",
                     config={"policy": {"name": policy}}, summary={"client": {"lag_threshold_ms": 5.0}})


def test_a_replays_client_lag_stays_out_of_latency_and_is_flagged(tmp_path):
    _replay_run(tmp_path, "late", "least_outstanding", lag=0.02)
    _replay_run(tmp_path, "punctual", "least_outstanding", lag=0.001)
    by = {s["run_id"]: s for s in summarize(Catalog([tmp_path]), None, Options(ci=False))}
    for s in by.values():
        assert s["latency_from"] == SENT
        assert s["ttft"]["mean"] == pytest.approx(0.1)          # lag not added
        assert s["wait"]["kind"] == "client" and not s["wait"]["included"]
    assert by["late"]["wait"]["p99"] == pytest.approx(0.02) and by["late"]["wait"]["flagged"]
    assert not by["punctual"]["wait"]["flagged"]


def test_a_replay_through_a_holding_policy_counts_from_arrival(tmp_path):
    _replay_run(tmp_path, "held", "fcfs_queue", lag=0.3)
    s = summarize(Catalog([tmp_path]), None, Options(ci=False))[0]
    assert s["latency_from"] == ARRIVAL and s["wait"]["kind"] == "router+client" and s["wait"]["included"]
    assert s["ttft"]["mean"] == pytest.approx(0.4)


def test_which_policies_hold_and_where_imports_count_from():
    assert holds_requests("fcfs_queue") and holds_requests("edf") and holds_requests("predicted_sjf")
    assert not holds_requests("least_outstanding") and not holds_requests("no-such-policy")
    assert latency_from({"backend": "sim"}) == ARRIVAL
    assert latency_from({"backend": "vllm", "config": {"policy": "fcfs_queue"}}) == SENT
