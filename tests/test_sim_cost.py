"""The roofline cost model: capacity, step times, MoE and tensor parallelism, power, and the fast path."""

from __future__ import annotations

import math

import pytest

from llmlb_bench.sim import ClusterConfig, load_catalog
from llmlb_bench.sim.cost import GIB, NON_TORCH_BYTES, CostModel
from llmlb_bench.sim.fleet import cost_model


def _model(gpu: str = "a100-80g", model: str = "llama-3-8b", tp: int = 1) -> CostModel:
    cfg = ClusterConfig.build(gpu=gpu, model=model, tp=tp, max_num_batched_tokens=8192, max_num_seqs=256)
    return cost_model(cfg.pools[0])


def test_kv_capacity_is_memory_minus_weights_activations_and_reserve():
    c = _model()
    m = load_catalog().models["llama-3-8b"]
    activations = 8192 * (4 * 4096 + 2 * 14336) * 2 + 256 * 128256 * 4
    free = 80 * GIB * 0.9 - 8.03e9 * 2 - activations - NON_TORCH_BYTES
    assert c.kv_blocks == int(free // (m.kv_bytes_per_token * 16)) == 28279


def test_fast_path_matches_the_step_breakdown():
    for gpu, model, tp in [("a100-80g", "llama-3-8b", 1), ("h100-sxm", "llama-3-70b", 4),
                           ("a100-80g", "mixtral-8x7b", 2), ("h200", "deepseek-v3", 8)]:
        c = _model(gpu, model, tp)
        for seqs, ctx in [(1, 100), (64, 64_000), (256, 1_000_000)]:
            step = c.decode_step(seqs, ctx)
            assert c.run_step(seqs, ctx, ctx, seqs) == pytest.approx((step.total, c.power_w(step)), rel=1e-12)
        mixed = c.step(2000, 2000 * 1000.5, 2000, 10, 5000, 11)
        fast = c.run_step(2010, 2000 * 1000.5 + 5000, 2000 + 5000, 11)
        assert fast == pytest.approx((mixed.total, c.power_w(mixed)), rel=1e-12)


def test_prefill_is_compute_bound_and_small_decode_memory_bound():
    c = _model()
    prefill = c.step(4096, 4096 * 2048.5, 4096, 0, 0, 1)
    decode = c.decode_step(1, 1000)
    assert prefill.compute_s > 10 * prefill.memory_s
    assert decode.memory_s > 100 * decode.compute_s
    # a batch-1 decode step streams all weights: ~16 GB at 85% of 2039 GB/s
    assert decode.memory_s == pytest.approx(8.03e9 * 2 / (2039e9 * 0.85), rel=0.02)
    # smooth roofline: never below either term, at most sqrt(2) x the larger
    for s in (prefill, decode, c.decode_step(128, 128_000)):
        core = s.total - s.comm_s - s.overhead_s
        assert max(s.compute_s, s.memory_s) <= core <= math.sqrt(2) * max(s.compute_s, s.memory_s) + 1e-15


def test_moe_reads_more_experts_as_the_batch_grows():
    c = _model("a100-80g", "mixtral-8x7b", 2)
    one, many = c.weights_read(1), c.weights_read(512)
    assert one < 0.45 * many and many == pytest.approx(c.weight_bytes, rel=1e-6)
    # one token touches 2 of 8 experts
    assert one == pytest.approx(c.dense_bytes + c.expert_bytes * 2 / 8, rel=1e-9)


def test_tensor_parallelism_splits_work_and_adds_all_reduce():
    one, four = _model("h100-sxm", "llama-3-70b", 4), _model("h100-sxm", "llama-3-70b", 8)
    a, b = one.decode_step(32, 32_000), four.decode_step(32, 32_000)
    assert b.memory_s == pytest.approx(a.memory_s / 2, rel=0.01)
    assert b.comm_s > a.comm_s > 0
    assert _model().decode_step(32, 32_000).comm_s == 0


def test_power_between_idle_and_max():
    c = _model()
    g = load_catalog().gpus["a100-80g"]
    prefill = c.power_w(c.step(8192, 8192 * 4096.5, 8192, 0, 0, 1))
    decode = c.power_w(c.decode_step(1, 1000))
    assert g.idle_w < decode < prefill <= g.max_w
    assert prefill > 0.85 * g.max_w
    assert _model("h100-sxm", "llama-3-70b", 4).idle_power_w == 4 * load_catalog().gpus["h100-sxm"].idle_w
