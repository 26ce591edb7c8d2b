"""KV swap as a preemption mode (vLLM v0's ``preemption_mode="swap"``): conservation, no
recompute, copy time = bytes / host-link bandwidth, when swapping wins and when it loses."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import llmlb_bench.sim.replica as replica_mod
from llmlb_bench.errors import UserError
from llmlb_bench.policies import RouteRequest
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.fleet import Fleet
from llmlb_bench.sim.replica import Request
from tests.sim_helpers import TINY_GPU, by_request_id, in_pure_python, poisson_trace, run_sim, trace
from tests.test_sim_core import _blocks_held

#: Llama-3-8B KV bytes of one 16-token block: 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes x 16
BLOCK_BYTES = 2 * 32 * 8 * 128 * 2 * 16
#: the tiny GPU's KV cache for Llama-3-8B at a budget of 8192 tokens and utilisation 1.0
TINY_BLOCKS = 631


@pytest.fixture
def catalog(tmp_path):
    """The tiny-KV GPU at three host-link speeds: its default (25 GB/s), slow and very fast."""
    path = tmp_path / "tiny.toml"
    slow = TINY_GPU.replace("[gpus.tiny-gpu]", "[gpus.tiny-slow]") + "host_link_gb_s = 0.5\n"
    fast = TINY_GPU.replace("[gpus.tiny-gpu]", "[gpus.tiny-fast]") + "host_link_gb_s = 1e6\n"
    path.write_text(TINY_GPU + slow + fast)
    return str(path)


def _cfg(catalog: str, gpu: str = "tiny-gpu", **kw) -> ClusterConfig:
    base = dict(replicas=1, gpu=gpu, gpu_memory_utilization=1.0, catalogs=(catalog,), max_num_batched_tokens=8192,
                max_num_seqs=256)
    return ClusterConfig.build(**{**base, **kw})


def _three_long_requests():
    """Three 2000 + 2000-token requests at t = 0 on 631 blocks: all prefill in step 1, then decode
    side by side until 3 x ceil(ctx / 16) blocks no longer fit. At ctx = 3360 each holds 210 blocks
    (630 in use) and the next step needs 3 new ones, so the last admitted (request 2) is preempted
    holding 210 blocks; it comes back when the other two finish. The step sequence does not depend
    on step durations (no arrival after t = 0), so runs differ only by what preemption costs."""
    return trace(np.zeros(3), 2000, 2000)


def test_swap_copy_time_is_bytes_over_the_host_link_bandwidth(tmp_path, catalog):
    ends, transfer = {}, {}
    for gpu, gb_s in (("tiny-gpu", 25.0), ("tiny-slow", 0.5), ("tiny-fast", 1e6)):
        req, _, summary = run_sim(tmp_path, _three_long_requests(), _cfg(catalog, gpu, preemption="swap"),
                                  run_id=gpu)
        assert summary["kv_blocks"]["r0"] == TINY_BLOCKS
        swap = summary["swap"]
        assert (swap["swap_outs"], swap["swap_ins"], swap["recompute_fallbacks"]) == (1, 1, 0)
        # 210 blocks out, the same 210 back in
        assert swap["transfer_s"] == pytest.approx(2 * 210 * BLOCK_BYTES / (gb_s * 1e9), rel=1e-12)
        assert by_request_id(req)["preemptions"].to_pylist() == [0, 0, 1]
        ends[gpu], transfer[gpu] = max(req["last_token_s"].to_pylist()), swap["transfer_s"]
    # the swapping steps are longer by exactly the copy time; nothing else changes
    assert ends["tiny-slow"] - ends["tiny-fast"] == pytest.approx(transfer["tiny-slow"] - transfer["tiny-fast"],
                                                                  rel=1e-9)
    assert ends["tiny-gpu"] - ends["tiny-fast"] == pytest.approx(transfer["tiny-gpu"] - transfer["tiny-fast"],
                                                                 rel=1e-6)


def test_swap_skips_the_recompute_and_wins_on_a_fast_link_loses_on_a_slow_one(tmp_path, catalog):
    """Recompute prefills the victim's 2000 prompt + 1361 generated tokens again (about 0.2 s on
    this GPU); swapping copies 2 x 210 blocks: 35 ms at 25 GB/s, 1.8 s at 0.5 GB/s."""
    runs = {}
    for name, gpu, mode in (("recompute", "tiny-gpu", "recompute"), ("swap", "tiny-gpu", "swap"),
                            ("swap-slow", "tiny-slow", "swap")):
        req, _, summary = run_sim(tmp_path, _three_long_requests(), _cfg(catalog, gpu, preemption=mode), run_id=name)
        req = by_request_id(req)
        assert req["output_tokens"].to_pylist() == [2000] * 3
        runs[name] = (req["last_token_s"].to_pylist()[2], summary)
    assert runs["recompute"][1]["prefill_tokens"] == 3 * 2000 + 2000 + 1361
    assert runs["swap"][1]["prefill_tokens"] == runs["swap-slow"][1]["prefill_tokens"] == 3 * 2000
    assert "swap" not in runs["recompute"][1]
    assert runs["swap"][0] < runs["recompute"][0] < runs["swap-slow"][0]
    # the slow link's copies cost more than the recompute they avoid, by about 1.8 - 0.2 s
    assert runs["swap-slow"][0] - runs["swap"][0] == pytest.approx(2 * 210 * BLOCK_BYTES * (1 / 0.5e9 - 1 / 25e9))


def test_swap_conserves_requests_tokens_blocks_and_swap_space(tmp_path, catalog, monkeypatch, request):
    """Under heavy KV pressure, with a swap space small enough to fill (then recompute takes over),
    under FCFS and priority order: everything finishes with every token, and neither the GPU's
    blocks nor the CPU's swap blocks are ever over-committed."""
    if in_pure_python(request):  # hooks into Replica.boundary: the pure-Python core only
        return
    original = replica_mod.Replica.boundary
    peaks = {"kv": 0, "swap": 0}

    def checked_boundary(self, done):
        nt = original(self, done)
        held = sum(_blocks_held(self, r) for r in self.running)
        assert held == self.kv.used
        next_need = self.phase[(self.step + 1) % self.bs] if self.decoding else 0
        assert self.kv.used + next_need <= self.kv.total
        assert 0 <= self.kv.swap_used <= self.kv.swap_total
        assert self.kv.swap_used == sum(blocks for _, blocks, _ in self.kv.swapped)
        peaks["kv"] = max(peaks["kv"], self.kv.used)
        peaks["swap"] = max(peaks["swap"], self.kv.swap_used)
        return nt

    monkeypatch.setattr(replica_mod.Replica, "boundary", checked_boundary)
    table = poisson_trace(300, rate=6.0, seed=7, input_mean=800, output_mean=300)
    table = table.set_column(table.schema.get_field_index("priority"), "priority",
                             pa.array(np.arange(300) % 3, pa.int8()))
    # 0.3 GiB holds 153 blocks: a few victims at a time
    for scheduler in ("fcfs", "priority"):
        cfg = _cfg(catalog, preemption="swap", swap_space_gib=0.3, scheduler=scheduler)
        req, series, summary = run_sim(tmp_path, table, cfg, run_id=scheduler)
        swap = summary["swap"]
        assert swap["swap_blocks"] == {"r0": 153}
        assert swap["swap_outs"] > 10 and swap["recompute_fallbacks"] > 0
        assert swap["swap_ins"] == swap["swap_outs"]
        assert summary["preemptions"] == swap["swap_outs"] + swap["recompute_fallbacks"]
        assert sum(req["preemptions"].to_pylist()) == summary["preemptions"]
        assert req["status"].to_pylist() == ["ok"] * 300
        assert req["output_tokens"].to_pylist() == req["requested_output_tokens"].to_pylist()
        for tt, n in zip(req["token_times"].to_pylist(), req["output_tokens"].to_pylist()):
            times = np.concatenate([s["start_s"] + s["gap_s"] * np.arange(s["count"]) for s in tt])
            assert len(times) == n and np.all(np.diff(times) > 0)
        assert max(series["kv_blocks_used"].to_pylist()) <= TINY_BLOCKS
    assert peaks["kv"] > 0.9 * TINY_BLOCKS and peaks["swap"] > 0.5 * 153


def test_swap_beats_recompute_under_kv_pressure_with_long_prompts(tmp_path, catalog):
    """Long prompts (mean 2500 tokens) on a small KV cache near its capacity: recompute prefills
    every victim again (prompt and output so far), swapping copies its KV at 25 GB/s, which is far
    cheaper, so fewer prefill tokens are computed and requests finish sooner. At 0.5 GB/s the
    copies cost more than the recompute they avoid and swapping loses."""
    table = poisson_trace(300, rate=0.25, seed=11, input_mean=2500, output_mean=400)
    out = {}
    for name, gpu, mode in (("recompute", "tiny-gpu", "recompute"), ("swap", "tiny-gpu", "swap"),
                            ("swap-slow", "tiny-slow", "swap")):
        req, _, summary = run_sim(tmp_path, table, _cfg(catalog, gpu, preemption=mode), run_id=name)
        assert req["status"].to_pylist() == ["ok"] * 300
        e2e = pc.subtract(req["last_token_s"], req["scheduled_s"]).to_numpy()
        out[name] = (summary, e2e.mean())
    rec, swp = out["recompute"][0], out["swap"][0]
    assert rec["preemptions"] > 20 and swp["swap"]["swap_outs"] > 20
    assert swp["prefill_tokens"] < 0.9 * rec["prefill_tokens"]
    assert out["swap"][1] < 0.97 * out["recompute"][1] and out["swap-slow"][1] > 1.3 * out["recompute"][1]


def test_swap_runs_are_deterministic(tmp_path, catalog):
    table = poisson_trace(200, rate=6.0, seed=3, input_mean=800, output_mean=300)
    cfg = _cfg(catalog, replicas=2, preemption="swap", swap_space_gib=0.3)
    a, sa, suma = run_sim(tmp_path, table, cfg, run_id="a")
    b, sb, sumb = run_sim(tmp_path, table, cfg, run_id="b")
    assert suma["swap"]["swap_outs"] > 0
    assert a.drop(["run_id"]).equals(b.drop(["run_id"])) and sa.drop(["run_id"]).equals(sb.drop(["run_id"]))
    assert {k: v for k, v in suma.items() if k != "wall_s"} == {k: v for k, v in sumb.items() if k != "wall_s"}


def test_an_aborted_swapped_out_request_gives_back_its_swap_space(catalog):
    """The live server's hook: a client that leaves while its request is swapped out."""
    rep = Fleet(_cfg(catalog, preemption="swap"), 16).replicas[0]
    reqs = [Request(i, RouteRequest(i, 0.0, 2000, 2000), 2000, 2000) for i in range(3)]
    for r in reqs:
        rep.enqueue(r, 0.0)
    done: list[Request] = []
    while not rep.kv.swapped:
        rep.boundary(done)
    assert rep.kv.swapped[0][0] is reqs[2] and rep.kv.swap_used == 210
    assert rep.abort(reqs[2], rep.t) is True   # left the swap space at once
    assert not rep.kv.swapped and rep.kv.swap_used == 0
    while not rep.idle:
        rep.boundary(done)
    assert done == reqs[:2] and [r.generated for r in done] == [2000, 2000] and rep.kv.used == 0


@pytest.mark.parametrize("setting, value, message", [
    ("preemption", "swapp", "must be one of recompute, swap"),
    ("swap_space_gib", -1, "must be a number of GiB >= 0"),
    ("swap_space_gib", 0, "needs swap_space_gib > 0"),
])
def test_bad_swap_settings_name_the_field(setting, value, message):
    kw = {"preemption": "swap", setting: value}
    with pytest.raises(UserError) as err:
        ClusterConfig.build(**kw)
    assert message in str(err.value) and f"cluster.{setting}" in str(err.value)


def test_swap_is_a_per_pool_setting(catalog):
    cfg = _cfg(catalog, pools=[{"name": "a", "replicas": 1, "preemption": "swap", "swap_space_gib": 1.0},
                               {"name": "b", "replicas": 1}])
    fleet = Fleet(cfg, 16)
    # 1 GiB of 2 MiB blocks
    assert [r.kv.swap_total for r in fleet.replicas] == [512, 0]
    assert ClusterConfig.from_dict(cfg.to_dict()) == cfg
