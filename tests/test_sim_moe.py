"""MoE expert-load imbalance under expert parallelism and EPLB rebalancing: the slowdown
table against closed forms, EPLB's replication rule, the cost model's use of it, and the
effect on simulated latency."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binom

from llmlb_bench.errors import UserError
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.fleet import cost_model
from llmlb_bench.sim.moe import (DRAWS, MAX_LOG2, ExpertLoad, MoeSpec, eplb_layout, gpu_shares, imbalance_table,
                                 zipf_weights)
from sim_helpers import poisson_trace, run_sim


def test_two_gpus_with_even_load_match_the_binomial_expectation():
    # N = T k routed slots over 2 GPUs with probability 1/2 each: the busier one carries max(X, N - X),
    # X ~ Binomial(N, 1/2); f(T) = E[max(X, N - X)] / (N / 2), summed exactly
    table = imbalance_table(np.array([0.5, 0.5]), 2, np.random.default_rng(0))
    for j, f in enumerate(table):
        n = (1 << j) * 2
        x = np.arange(n + 1)
        exact = float(np.sum(binom.pmf(x, n, 0.5) * np.maximum(x, n - x))) / (n / 2)
        sd = math.sqrt(float(np.sum(binom.pmf(x, n, 0.5) * np.maximum(x, n - x) ** 2)) - (exact * n / 2) ** 2)
        assert abs(f - exact) <= 4 * sd / math.sqrt(DRAWS) / (n / 2) + 1e-12
    assert table[0] == pytest.approx(1.5, abs=0.1), "2 slots: both on one GPU half the time"


def test_large_batches_approach_ep_times_the_busiest_share():
    # Mixtral on 8 GPUs, one expert each, Zipf(1): the busiest GPU holds the top expert, 1 / H_8 of the load
    load = ExpertLoad(MoeSpec(zipf_s=1.0), experts=8, active=2, ep=8)
    h8 = sum(1 / r for r in range(1, 9))
    assert load.limit == pytest.approx(8 / h8, rel=1e-12)          # 2.943
    assert load.factor(1 << MAX_LOG2) == pytest.approx(8 / h8, rel=0.01)
    assert load.factor(1 << 20) == load.factor(1 << MAX_LOG2), "beyond the table: its last entry"
    # small batches are worse than the limit (sampling noise)
    assert load.factor(1) > 1.3 * load.factor(4096)
    # uniform popularity: no imbalance in the limit
    even = ExpertLoad(MoeSpec(zipf_s=0.0), experts=256, active=8, ep=8)
    assert even.limit == pytest.approx(1.0, rel=1e-12)
    assert even.factor(1 << MAX_LOG2) == pytest.approx(1.0, abs=0.01)


def test_factor_interpolates_linearly_between_powers_of_two():
    load = ExpertLoad(MoeSpec(zipf_s=1.2), experts=8, active=2, ep=4)
    t = load._table
    assert load.factor(96) == pytest.approx(t[6] + (t[7] - t[6]) * 0.5)
    assert load.factor(64) == t[6] and load.factor(0) == t[0]


def test_eplb_replication_minimises_the_largest_load_per_replica():
    p = zipf_weights(8, 1.2)[np.random.default_rng(3).permutation(8)]
    for redundant in (0, 4, 8, 12):
        layout = eplb_layout(p, 4, redundant)
        count = np.bincount([e for gpu in layout for e in gpu], minlength=8)
        assert count.sum() == 8 + redundant and all(len(g) == (8 + redundant) // 4 for g in layout)
        # every way of handing out the extra replicas (multisets of experts)
        best = min(max(p / (1 + np.bincount(extra, minlength=8)))
                   for extra in itertools.combinations_with_replacement(range(8), redundant))
        assert max(p / count) == pytest.approx(best, rel=1e-12)
        # packing: the busiest GPU carries at least the heaviest replica and at least the mean
        shares = gpu_shares(layout, p)
        assert shares.sum() == pytest.approx(1.0)
        assert shares.max() >= max(max(p / count), 1 / 4) - 1e-12


def test_eplb_rebalances_on_its_period_and_catches_up_with_drift():
    spec = MoeSpec(zipf_s=1.2, eplb_interval_s=10.0, redundant_experts=4, drift_s=25.0, seed=1)
    load = ExpertLoad(spec, experts=8, active=2, ep=4)
    before = load.limit
    assert load.next_change == 10.0
    load.advance(10.0)
    assert load.limit < 0.6 * before and load.next_change == 20.0
    load.advance(20.0)
    balanced = load.limit
    load.advance(25.0)          # hot experts move: the tuned layout goes stale until the next rebalance
    assert load.limit > 1.2 * balanced
    load.advance(30.0)
    assert load.limit == pytest.approx(balanced, rel=0.3) and load.limit < load.history[-2][1]
    assert [t for t, _ in load.history] == [0.0, 10.0, 20.0, 25.0, 30.0]


def test_cost_model_stretches_only_the_routed_expert_compute():
    cfg = ClusterConfig.build(model="mixtral-8x7b", gpu="h100-sxm", tp=4, moe={"zipf_s": 1.2})
    skewed, even = cost_model(cfg.pools[0], (), cfg.moe_spec), cost_model(cfg.pools[0])
    load = skewed.expert_load
    for tokens in (1, 32, 2048, 8192):
        a = skewed.step(tokens, tokens * 500.0, tokens, 0, 0.0, 1)
        b = even.step(tokens, tokens * 500.0, tokens, 0, 0.0, 1)
        assert a.compute_s == b.compute_s and a.memory_s == b.memory_s
        assert a.skew_s == pytest.approx(skewed.expert_flops * tokens * (load.factor(tokens) - 1) / skewed.peak_flops)
        t, power = skewed.run_step(tokens, tokens * 500.0, tokens, 1)
        assert t == pytest.approx(a.total, rel=1e-12)
        assert power == pytest.approx(skewed.power_w(a), rel=1e-12), "power follows the balanced work"
    # a big prefill step is compute-bound: it slows down by about the routed experts' share x (f - 1)
    a, b = skewed.step(8192, 8192 * 4096.0, 8192, 0, 0.0, 1), even.step(8192, 8192 * 4096.0, 8192, 0, 0.0, 1)
    assert a.total / b.total > 1 + 0.5 * (load.factor(8192) - 1)
    # EPLB's redundant replicas cost memory: (8 + 4) / 8 the expert weights, fewer KV blocks
    cfg_r = ClusterConfig.build(model="mixtral-8x7b", gpu="h100-sxm", tp=4,
                                moe={"zipf_s": 1.2, "eplb_interval_s": 10, "redundant_experts": 4})
    red = cost_model(cfg_r.pools[0], (), cfg_r.moe_spec)
    assert red.expert_bytes == pytest.approx(even.expert_bytes * 1.5) and red.kv_blocks < even.kv_blocks


def test_expert_skew_slows_prefill_and_eplb_wins_it_back(tmp_path):
    # Mixtral 8x7B on 2 replicas of 4 H100s, long prompts (compute-bound prefill)
    table = poisson_trace(400, rate=10.0, seed=1, input_mean=3000, output_mean=100)
    base = dict(replicas=2, model="mixtral-8x7b", gpu="h100-sxm", tp=4)

    def ttft(run_id, moe):
        req, _, summary = run_sim(tmp_path, table, ClusterConfig.build(**base, moe=moe), run_id=run_id)
        return float(np.mean(req.column("first_token_s").to_numpy() - req.column("sent_s").to_numpy())), summary

    even, _ = ttft("even", None)
    skewed, s1 = ttft("skew", {"zipf_s": 1.2})
    eplb, s2 = ttft("eplb", {"zipf_s": 1.2, "eplb_interval_s": 5.0, "redundant_experts": 4})
    # measured: mean TTFT 63 ms balanced, 107 ms with Zipf(1.2) experts, 72 ms with EPLB every 5 s
    assert skewed > 1.4 * even
    assert even < eplb < even + 0.4 * (skewed - even)
    assert s1["expert_load"]["default"]["mean_slowdown"] == pytest.approx(1.914, abs=0.01)
    history = s2["expert_load"]["default"]["slowdown_history"]
    assert history[0] == [0.0, pytest.approx(1.914, abs=0.01)] and history[1][0] == 5.0 and history[1][1] < 1.1


def test_moe_settings_are_checked():
    with pytest.raises(UserError, match="no pool serves a MoE model"):
        ClusterConfig.build(model="llama-3-8b", moe={"zipf_s": 1.0})
    with pytest.raises(UserError, match="unknown setting 'skew'"):
        ClusterConfig.build(model="mixtral-8x7b", gpu="h100-sxm", tp=4, moe={"skew": 1.0})
    with pytest.raises(UserError, match=r"must split evenly over the 4 GPUs"):
        ClusterConfig.build(model="mixtral-8x7b", gpu="h100-sxm", tp=4, moe={"eplb_interval_s": 5, "redundant_experts": 2})
    with pytest.raises(UserError, match="set eplb_interval_s > 0"):
        ClusterConfig.build(model="mixtral-8x7b", gpu="h100-sxm", tp=4, moe={"redundant_experts": 4})
    with pytest.raises(UserError, match="cluster.moe.popularity"):
        ClusterConfig.build(model="mixtral-8x7b", gpu="h100-sxm", tp=4, moe={"popularity": "pareto"})
    cfg = ClusterConfig.build(model="mixtral-8x7b", gpu="h100-sxm", tp=4, moe={"popularity": "dirichlet", "alpha": 0.3})
    assert ClusterConfig.from_dict(cfg.to_dict()) == cfg
