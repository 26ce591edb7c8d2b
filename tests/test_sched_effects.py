"""Engine-level schedulers' documented effects, in the simulator on workloads built for them:
VTC narrows the service gap between a heavy and a light tenant; predicted SJF lowers mean
latency when its predictor is good (tau 0.9) and not when it is noise (tau 0); EDF on
per-class TTFT targets raises the tight class's attainment."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.policies import make_policy
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from llmlb_bench.store.views import Catalog
from sim_helpers import trace


def _poisson(rng: np.random.Generator, rate: float, duration: float) -> np.ndarray:
    t = np.cumsum(rng.exponential(1.0 / rate, int(rate * duration * 1.5) + 10))
    return t[t < duration]


def _two_tenants(heavy_rate: float, light_rate: float, duration: float, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    heavy, light = _poisson(rng, heavy_rate, duration), _poisson(rng, light_rate, duration)
    arrival = np.concatenate([heavy, light])
    tenant = np.array(["heavy"] * len(heavy) + ["light"] * len(light))
    order = np.argsort(arrival, kind="stable")
    n = len(arrival)
    return trace(arrival[order], rng.integers(300, 700, n), rng.integers(50, 150, n),
                 tenant=pa.array(tenant[order]).dictionary_encode())


def _simulate(tmp_path, table, run_id, seed=0, **cluster):
    cfg = ClusterConfig.build(replicas=1, **cluster)
    with RunStore(tmp_path, config={"cluster": cfg.to_dict()}, backend="sim", run_id=run_id) as run:
        simulate(table, cfg, make_policy("round_robin"), run, seed=seed)
    return pq.read_table(tmp_path / run_id / "requests.parquet")


def test_vtc_narrows_the_service_gap_between_a_heavy_and_a_light_tenant(tmp_path):
    # one replica with 16 seats completes about 9.2 requests/s; for 60 s a heavy tenant offers
    # 12/s and a light one 6/s: both stay backlogged, each above its fair half
    table = _two_tenants(12.0, 6.0, 60.0)
    _simulate(tmp_path, table, "fcfs", max_num_seqs=16)
    _simulate(tmp_path, table, "vtc", max_num_seqs=16, scheduler="vtc")
    runs = {s["run_id"]: s for s in summarize(Catalog([tmp_path]), None, Options(window_s=10.0))}
    fcfs, vtc = runs["fcfs"]["fairness"], runs["vtc"]["fairness"]
    # measured (trace seeds 0-2): mean service gap (VTC's measure: weighted tokens received in
    # 10 s windows where both tenants are backlogged) 21,348 / 20,126 / 24,740 under FCFS,
    # 5,068 / 6,804 / 7,035 under VTC; Jain's index 0.90 -> 0.97 (seed 0)
    assert vtc["service_gap_mean"] < 0.4 * fcfs["service_gap_mean"]
    assert vtc["jain_service"] > fcfs["jain_service"] + 0.04
    # the same work gets done; the light tenant no longer queues behind the heavy one
    # (mean E2E per output token 0.285 -> 0.095 s)
    assert abs(runs["vtc"]["request_throughput"] - runs["fcfs"]["request_throughput"]) < 0.02 * runs["fcfs"][
        "request_throughput"]
    light = lambda f: f["per_tenant"]["light"]["norm_latency_mean"]  # noqa: E731
    assert light(vtc) < 0.5 * light(fcfs)


def test_predicted_sjf_lowers_mean_latency_only_with_a_good_predictor(tmp_path):
    # one replica with 8 seats, offered 6 requests/s of heavy-tailed outputs: a queue builds up
    rng = np.random.default_rng(1)
    n = 800
    arrival = np.cumsum(rng.exponential(1 / 6.0, n))
    out = np.clip(rng.lognormal(np.log(100), 1.0, n), 1, 2000).astype(np.int32)
    table = trace(arrival, 200, out)

    def mean_e2e(run_id, seed=1, **cluster):
        req = _simulate(tmp_path, table, run_id, seed=seed, max_num_seqs=8, **cluster)
        return float(np.mean(req.column("last_token_s").to_numpy() - req.column("sent_s").to_numpy()))

    fcfs = mean_e2e("fcfs")
    # measured: FCFS 42.6 s; tau 0.9: 17.2-18.0 s; tau 0: 41.8-44.0 s (seeds 1-3)
    for seed in (1, 2):
        good = mean_e2e(f"good{seed}", seed, scheduler="sjf", scheduler_args={"tau": 0.9})
        noise = mean_e2e(f"noise{seed}", seed, scheduler="sjf", scheduler_args={"tau": 0.0})
        assert good < 0.5 * fcfs
        assert abs(noise - fcfs) < 0.1 * fcfs


def test_deadline_scheduler_raises_the_tight_class_ttft_attainment(tmp_path):
    # interactive requests (TTFT target 1 s) share an overloaded replica with batch ones (60 s)
    rng = np.random.default_rng(2)
    n = 700
    arrival = np.cumsum(rng.exponential(1 / 7.0, n))
    slo = rng.choice(["interactive", "batch"], n, p=[0.3, 0.7])
    table = trace(arrival, rng.integers(300, 700, n), rng.integers(50, 150, n),
                  slo_class=pa.array(slo).dictionary_encode())
    targets = {"deadlines": "interactive=1,batch=60"}

    def attainment(req, cls, limit):
        rows = [r for r in req.to_pylist() if r["slo_class"] == cls]
        return sum(r["first_token_s"] - r["sent_s"] <= limit for r in rows) / len(rows)

    fcfs = _simulate(tmp_path, table, "fcfs", max_num_seqs=8)
    edf = _simulate(tmp_path, table, "edf", max_num_seqs=8, scheduler="deadline", scheduler_args=targets)
    # measured: interactive TTFT <= 1 s for 5% of requests under FCFS, 100% under EDF; batch 100% in both
    assert attainment(edf, "interactive", 1.0) > 0.9 > 0.5 > attainment(fcfs, "interactive", 1.0)
    assert attainment(edf, "batch", 60.0) >= attainment(fcfs, "batch", 60.0) - 0.05
