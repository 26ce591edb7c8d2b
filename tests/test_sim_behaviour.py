"""Documented behaviour of serving systems that the simulator must reproduce
(prefix caching cutting TTFT is in test_sim_features)."""

from __future__ import annotations

import numpy as np

from llmlb_bench.sim import ClusterConfig
from sim_helpers import run_sim, trace


def _metrics(rows: list[dict]) -> dict[str, np.ndarray]:
    ttft = np.array([r["first_token_s"] - r["sent_s"] for r in rows])
    tpot = np.array([(r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in rows])
    itl = np.concatenate([np.diff(np.concatenate([s["start_s"] + s["gap_s"] * np.arange(s["count"])
                                                  for s in r["token_times"]])) for r in rows])
    return {"ttft": ttft, "tpot": tpot, "itl": itl}


def test_chunked_prefill_lowers_tpot_tails_at_some_ttft_cost(tmp_path):
    """Sarathi-Serve (OSDI 2024): chunking long prefills bounds the stall they put on running decodes."""
    rng = np.random.default_rng(0)
    n = 400
    arrival = np.cumsum(rng.exponential(1 / 4.0, n))
    prompt = np.where(rng.random(n) < 0.2, 7000, rng.integers(100, 400, n))
    table = trace(arrival, prompt, rng.integers(100, 300, n))
    whole = _metrics(run_sim(tmp_path, table, ClusterConfig.build(replicas=1, chunked_prefill=False), run_id="whole")[0]
                     .to_pylist())
    chunked = _metrics(run_sim(tmp_path, table, ClusterConfig.build(replicas=1, max_num_batched_tokens=512),
                               run_id="chunked")[0].to_pylist())
    assert np.percentile(chunked["tpot"], 99) < 0.8 * np.percentile(whole["tpot"], 99)
    assert np.percentile(chunked["itl"], 99) < 0.2 * np.percentile(whole["itl"], 99)
    assert chunked["ttft"].mean() > 1.1 * whole["ttft"].mean()


def test_disaggregation_raises_tpot_slo_attainment(tmp_path):
    """DistServe (OSDI 2024) / Splitwise (ISCA 2024): decode replicas that never run prefills keep
    inter-token times low and steady; the price is the KV transfer and a separate prefill queue."""
    rng = np.random.default_rng(0)
    n = 600
    table = trace(np.cumsum(rng.exponential(1 / 3.0, n)), rng.integers(1500, 4000, n), rng.integers(100, 400, n))
    mixed = _metrics(run_sim(tmp_path, table, ClusterConfig.build(replicas=3), run_id="mixed")[0].to_pylist())
    pd = ClusterConfig.build(pools=[{"name": "prefill", "replicas": 1}, {"name": "decode", "replicas": 2}])
    split = _metrics(run_sim(tmp_path, table, pd, policy="pd_pair", run_id="pd")[0].to_pylist())
    slo = 0.015
    assert np.mean(split["tpot"] <= slo) > 0.95 > 0.6 > np.mean(mixed["tpot"] <= slo)
    assert np.percentile(split["ttft"], 99) > np.percentile(mixed["ttft"], 99)
