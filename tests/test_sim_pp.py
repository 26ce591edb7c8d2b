"""Pipeline parallelism: weights and KV split over the stages, step time = tp-only time plus the
sends between stages (no micro-batching), power and GPU-hours over tp x pp GPUs."""

from __future__ import annotations

import numpy as np
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.catalog import load_catalog
from llmlb_bench.sim.cost import CostModel
from tests.sim_helpers import run_sim, trace

GIB = 2.0 ** 30
# catalog figures, written out: Llama-3-8B and the A100-80G
LAYERS, HIDDEN, INTERMEDIATE, VOCAB = 32, 4096, 14336, 128256
KV_PER_TOKEN = 2 * LAYERS * 8 * 128 * 2          # K and V, 8 KV heads of 128 dims, bf16
A100_LINK_S, A100_LINK_GB_S, A100_IDLE_W = 48e-6, 346.0, 55.0


def _cost(tp: int = 1, pp: int = 1, model: str = "llama-3-8b") -> CostModel:
    cat = load_catalog()
    return CostModel(cat.model(model), cat.gpu("a100-80g"), tp, pp=pp, max_num_batched_tokens=2048,
                     max_num_seqs=256)


def test_kv_capacity_is_what_one_stages_gpu_has_left_and_grows_more_than_pp_fold():
    weights = _cost().weight_bytes
    activations = 2048 * (4 * HIDDEN + 2 * INTERMEDIATE) * 2 + 256 * VOCAB * 4
    blocks = {}
    for pp in (1, 2, 4):
        free = 80 * GIB * 0.9 - weights / pp - activations - GIB
        blocks[pp] = _cost(pp=pp).kv_blocks
        assert blocks[pp] == int(free // (KV_PER_TOKEN / pp * 16))
    assert blocks[2] > 2 * blocks[1] and blocks[4] > 4 * blocks[1]


def test_weights_per_gpu_divide_by_pp_with_the_largest_stage_counted():
    one = _cost().weight_bytes
    assert one == pytest.approx(8.03e9 * 2, rel=1e-3)                 # 8.03 B parameters in bf16
    assert _cost(pp=2).weight_bytes == pytest.approx(one / 2, rel=1e-15)
    assert _cost(pp=4).weight_bytes == pytest.approx(one / 4, rel=1e-15)
    # 32 layers over 3 stages: 11, 11, 10; memory is the largest stage's
    assert _cost(pp=3).weight_bytes == pytest.approx(one * 11 / 32, rel=1e-15)
    assert _cost(pp=3).kv_bytes_per_token_gpu == pytest.approx(KV_PER_TOKEN * 11 / 32, rel=1e-15)


def test_one_requests_prefill_takes_the_tp_time_plus_the_sends_between_stages(tmp_path):
    """One request alone: its prefill step (one chunk) and each decode step take the tp-only time plus pp - 1
    sends of 2 x hidden bf16 values per token (a 1/tp slice per TP rank) over the interconnect."""
    prompt, out = 3000, 200
    runs = {}
    for tp, pp in ((2, 1), (2, 2), (2, 4)):
        cfg = ClusterConfig.build(replicas=1, gpu="a100-80g", model="llama-3-8b", tp=tp, pp=pp, max_num_batched_tokens=8192)
        runs[pp] = run_sim(tmp_path, trace(np.array([0.0]), prompt, out), cfg, run_id=f"pp{pp}")[0].to_pylist()[0]
    for pp in (2, 4):
        send = A100_LINK_S + 2 * HIDDEN * 2 / 2 / (A100_LINK_GB_S * 1e9)        # one send, per token of the batch
        prefill_sends = (pp - 1) * (A100_LINK_S + 2 * HIDDEN * 2 * prompt / 2 / (A100_LINK_GB_S * 1e9))
        assert runs[pp]["first_token_s"] - runs[1]["first_token_s"] == pytest.approx(prefill_sends, rel=1e-6)
        decode_sends = (out - 1) * (pp - 1) * send
        e2e = runs[pp]["last_token_s"] - runs[1]["last_token_s"]
        assert e2e == pytest.approx(prefill_sends + decode_sends, rel=1e-4)
    # the sends cost little: 4 stages add well under 1% to this prefill
    assert runs[4]["first_token_s"] < 1.01 * runs[1]["first_token_s"]


def test_a_pipeline_draws_idle_power_on_every_gpu_and_counts_every_gpu_hour(tmp_path):
    cfg = ClusterConfig.build(replicas=1, gpu="a100-80g", model="llama-3-8b", tp=2, pp=2, series_interval_s=1.0)
    req, series, summary = run_sim(tmp_path, trace(np.array([0.0, 20.0]), 1000, 100), cfg)
    end = summary["sim_time_s"]
    assert summary["gpu_hours"] == pytest.approx(4 * end / 3600, rel=1e-12)
    assert summary["cost_usd"] == pytest.approx(4 * end / 3600 * 5.12, rel=1e-12)
    busy = sum(r["last_token_s"] - r["scheduled_s"] for r in req.to_pylist())
    assert summary["mean_utilization"] == pytest.approx(busy / end, rel=1e-6)
    power = np.array(series["power_w"].to_pylist())
    # an idle second: 4 GPUs at idle power; a busy one: above that, but at most one stage (2 GPUs) busy
    assert power.min() == pytest.approx(4 * A100_IDLE_W, rel=1e-6)
    assert power.max() <= 4 * A100_IDLE_W + 2 * (400 - A100_IDLE_W) + 1e-6


def test_pp_lets_a_model_too_big_for_one_gpu_fit():
    with pytest.raises(UserError, match="raise tp, pp or gpu_memory_utilization"):
        _cost(model="llama-3-70b")
    assert _cost(pp=4, model="llama-3-70b").kv_blocks > 10_000


@pytest.mark.parametrize("pp, message", [(0, "must be a positive integer"), (33, "fewer than pp = 33 stages")])
def test_bad_pp_names_the_field(pp, message):
    with pytest.raises(UserError) as err:
        ClusterConfig.build(model="llama-3-8b", pp=pp)
    assert message in str(err.value) and "cluster.pp" in str(err.value)


def test_pp_is_a_per_pool_setting():
    cfg = ClusterConfig.build(model="llama-3-8b", pools=[{"name": "a", "replicas": 1, "pp": 2}, {"name": "b", "replicas": 1}])
    assert [p.gpus for p in cfg.pools] == [2, 1]
    assert ClusterConfig.from_dict(cfg.to_dict()) == cfg
