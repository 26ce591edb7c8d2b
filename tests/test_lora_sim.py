"""Multi-LoRA in the simulator (sim/lora.py): vLLM's adapter slots, load costs and batching limit,
checked against the numbers they follow from."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.cache_accounting import offered_tokens
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.catalog import load_catalog
from llmlb_bench.sim.cost import CostModel
from llmlb_bench.sim.fleet import Fleet
from llmlb_bench.sim.lora import adapter_bytes
from tests.sim_helpers import by_request_id, run_sim, trace


def _cluster(**kw):
    return ClusterConfig.build(replicas=1, gpu="a100-80g", model="llama-3-8b", **kw)


def _ttft(req: pa.Table) -> list[float]:
    r = by_request_id(req)
    return (pc.subtract(r.column("first_token_s"), r.column("scheduled_s"))).to_pylist()


def test_adapter_size_follows_rank_and_model_shapes():
    m = load_catalog().model("llama-3-8b")
    # q 4096->4096, k and v 4096->1024, o 4096->4096, gate and up 4096->14336, down 14336->4096
    per_layer_weights = 16 * (8192 + 2 * 5120 + 8192 + 2 * 18432 + 18432)
    assert adapter_bytes(m, 16) == 32 * per_layer_weights * 2 == 83_886_080     # the 84 MB of a bf16 r=16 adapter
    assert adapter_bytes(m, 64) == 4 * adapter_bytes(m, 16)


def test_first_use_of_an_adapter_costs_its_fetch_and_host_link_copy(tmp_path):
    # one request at a time on an idle replica: base model, adapter a (cold), a again (resident)
    t = trace(np.array([0.0, 10.0, 20.0]), 500, 5, adapter=pa.array([None, "a", "a"]))
    req, _, summary = run_sim(tmp_path, t, _cluster(max_loras=1, lora_fetch_gb_s=4.0))
    base, cold, warm = _ttft(req)
    size = adapter_bytes(load_catalog().model("llama-3-8b"), 16)
    host = load_catalog().gpu("a100-80g").host_link_gb_s
    assert cold - base == pytest.approx(size / 4e9 + size / (host * 1e9), rel=1e-9)
    assert warm == pytest.approx(base, rel=1e-12)
    assert summary["lora"]["loads"] == {"r0": 1} and summary["lora"]["fetches"] == {"r0": 1}
    assert by_request_id(req).column("adapter").to_pylist() == [None, "a", "a"]


def test_max_loras_limits_distinct_adapters_in_a_batch_and_skips_without_blocking(tmp_path):
    # a, b, c, a, base at t=0 with max_loras=2: c cannot join (a and b hold both slots) and waits
    # until a's and b's requests leave; the a and base requests behind it are admitted at once
    adapters = ["a", "b", "c", "a", None]
    t = trace(np.zeros(5), 200, np.array([100, 50, 20, 100, 20]), adapter=pa.array(adapters))
    req = by_request_id(run_sim(tmp_path, t, _cluster(max_loras=2))[0])
    first, last = req.column("first_token_s").to_pylist(), req.column("last_token_s").to_pylist()
    assert max(first[i] for i in (0, 1, 3, 4)) < 0.2            # all in the first prefill step
    assert first[2] >= last[1]                                  # c's slot came free with b's end
    assert first[2] < last[0]                                   # ... not waiting for a as well


def test_each_batch_holds_at_most_max_loras_adapters_under_load(tmp_path):
    rng = np.random.default_rng(3)
    n = 400
    names = rng.choice([f"l{k}" for k in range(8)], n).tolist()
    t = trace(np.sort(rng.uniform(0, 20, n)), rng.integers(50, 400, n), rng.integers(10, 200, n),
              adapter=pa.array(names))
    req, series, summary = run_sim(tmp_path, t, _cluster(max_loras=3, max_cpu_loras=4))
    assert set(req.column("status").to_pylist()) == {"ok"}
    # the running adapters at every instant: requests between their first prefill and last token
    # overlap; from token times alone, count distinct adapters over requests decoding at t
    first = np.array(req.column("first_token_s").to_pylist())
    last = np.array(req.column("last_token_s").to_pylist())
    ad = np.array(req.column("adapter").to_pylist())
    for t0 in np.linspace(1, 30, 300):
        live = (first <= t0) & (last > t0)
        assert len(set(ad[live])) <= 3
    loads = sum(summary["lora"]["loads"].values())
    assert loads == pc.sum(series.column("adapter_loads")).as_py() > 3
    assert sum(summary["lora"]["fetches"].values()) <= loads


def test_adapter_slots_take_their_memory_from_the_kv_cache():
    plain, lora = Fleet(_cluster()), Fleet(_cluster(max_loras=4))
    cost = plain.replicas[0].cost
    assert isinstance(cost, CostModel)
    slots = 4 * adapter_bytes(cost.model, 16)
    assert plain.replicas[0].kv.total - lora.replicas[0].kv.total == \
        math.ceil(slots / (cost.kv_bytes_per_token_gpu * cost.block_size))


def test_an_adapter_sent_to_a_replica_without_lora_is_refused_like_vllm(tmp_path):
    t = trace(np.array([0.0, 1.0]), 100, 10, adapter=pa.array(["a", None]))
    req = by_request_id(run_sim(tmp_path, t, _cluster())[0])
    assert req.column("status").to_pylist() == ["rejected", "ok"]     # refused up front, as vLLM 404s it
    assert "does not exist" in req.column("error")[0].as_py()


def test_kv_computed_under_one_adapter_is_not_reused_by_another(tmp_path):
    hashes = [list(range(1, 33))] * 3      # the same 512-token prompt three times
    t = trace(np.array([0.0, 5.0, 10.0]), 512, 4, adapter=pa.array(["a", "b", "a"]),
              prefix_hashes=pa.array(hashes, pa.list_(pa.uint64())))
    req = by_request_id(run_sim(tmp_path, t, _cluster(max_loras=2))[0])
    assert req.column("cached_tokens").to_pylist() == [0, 0, 496]


@pytest.mark.parametrize("settings, problem", [
    ({"max_lora": 2}, "did you mean 'max_loras'"),
    ({"max_loras": 2, "lora_rank": 12}, "lora_rank: vLLM takes a LoRA rank of"),
    ({"max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras: must be >= max_loras (4)"),
    ({"max_loras": -1}, "max_loras: must be an integer >= 0"),
    ({"max_loras": 2, "preemption": "swap"}, "no KV swap"),
    ({"max_loras": 2, "lora_fetch_gb_s": 0}, "lora_fetch_gb_s: must be a number > 0"),
])
def test_bad_lora_settings_are_one_line_errors(settings, problem):
    with pytest.raises(UserError) as err:
        ClusterConfig.build(**settings)
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_cache_accounting_offers_no_reuse_across_adapters():
    # the same prompt under a, b, then a: only the second a can reuse the first a's KV
    hashes = pa.array([list(range(1, 33))] * 3, pa.list_(pa.uint64()))
    t = trace(np.array([0.0, 5.0, 10.0]), 512, 4, adapter=pa.array(["a", "b", "a"]), prefix_hashes=hashes)
    assert offered_tokens(t, 16).tolist() == [0, 0, 512]
    plain = trace(np.array([0.0, 5.0, 10.0]), 512, 4, prefix_hashes=hashes)
    assert offered_tokens(plain, 16).tolist() == [0, 512, 512]


def test_a_request_behind_one_waiting_for_a_slot_is_admitted_at_the_next_step(tmp_path):
    # a1 and a2 decode; at 0.5 s come a3 (no slot) and a base-model request: the base request
    # ends the decode run and is admitted at the next step boundary, a3 only when a1 or a2 ends
    t = trace(np.array([0.0, 0.0, 0.5, 0.5]), 40, np.array([400, 400, 8, 8]), adapter=pa.array(["a1", "a2", "a3", None]))
    req = by_request_id(run_sim(tmp_path, t, _cluster(max_loras=2))[0])
    ttft, last = _ttft(req), req.column("last_token_s").to_pylist()
    step = (last[0] - 0.5) / 350          # a decode step of the batch, roughly
    assert ttft[3] < 10 * step
    assert req.column("first_token_s")[2].as_py() >= min(last[0], last[1])
