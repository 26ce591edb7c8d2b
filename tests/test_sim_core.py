"""Core behaviour of the simulator: conservation, KV accounting, determinism, rejections."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim import replica as replica_mod
from llmlb_bench.sim.cost import CostModel
from sim_helpers import TINY_GPU, by_request_id, in_pure_python, poisson_trace, run_sim, trace


def _token_times(row_segments: list[dict]) -> np.ndarray:
    return np.concatenate([s["start_s"] + s["gap_s"] * np.arange(s["count"]) for s in row_segments])


def test_every_request_one_row_with_all_its_tokens(tmp_path):
    table = poisson_trace(600, rate=12.0, seed=3)
    req, series, summary = run_sim(tmp_path, table, ClusterConfig.build(replicas=2))
    assert req.num_rows == 600 and summary["status"] == {"ok": 600}
    assert sorted(req.column("request_id").to_pylist()) == list(range(600))
    req = by_request_id(req)
    assert req.column("output_tokens").to_pylist() == table.column("output_tokens").to_pylist()
    for row in req.to_pylist()[:200]:
        times = _token_times(row["token_times"])
        assert len(times) == row["output_tokens"]
        assert np.all(np.diff(times) > 0), "token times strictly increase"
        assert times[0] == pytest.approx(row["first_token_s"]) and times[-1] == pytest.approx(row["last_token_s"])
        assert row["first_token_s"] > row["sent_s"] == row["scheduled_s"]
        assert row["target"] in ("r0", "r1") and row["status"] == "ok"
    # run-length segments stay compact: far fewer segments than tokens
    segs = sum(len(r) for r in req.column("token_times").to_pylist())
    assert segs < 0.5 * sum(req.column("output_tokens").to_pylist())
    assert series.num_rows > 0 and set(series.column("target").to_pylist()) == {"r0", "r1"}


def test_identical_inputs_give_identical_rows(tmp_path):
    table = poisson_trace(400, rate=20.0, seed=5)
    cfg = ClusterConfig.build(replicas=3)
    a, sa, _ = run_sim(tmp_path, table, cfg, run_id="a")
    b, sb, _ = run_sim(tmp_path, table, cfg, run_id="b")
    assert a.drop(["run_id"]).equals(b.drop(["run_id"]))
    assert sa.drop(["run_id"]).equals(sb.drop(["run_id"]))


@pytest.fixture
def tiny_kv_catalog(tmp_path):
    """An A100-like GPU with little memory left for KV cache (~585 blocks for Llama-3-8B)."""
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_GPU)
    return str(path)


def test_kv_never_over_capacity_and_preemption_recomputes(tmp_path, tiny_kv_catalog, monkeypatch, request):
    if in_pure_python(request):  # hooks into Replica.boundary: the pure-Python core only
        return
    cfg = ClusterConfig.build(replicas=1, gpu="tiny-gpu", gpu_memory_utilization=1.0, catalogs=(tiny_kv_catalog,),
                              max_num_batched_tokens=8192, max_num_seqs=256)
    checked = []
    original = replica_mod.Replica.boundary

    def checked_boundary(self, done):
        nt = original(self, done)
        held = sum(_blocks_held(self, r) for r in self.running)
        assert held == self.kv.used, "aggregate block count matches the requests' blocks"
        next_need = self.phase[(self.step + 1) % self.bs] if self.decoding else 0
        assert self.kv.used + next_need <= self.kv.total
        checked.append(self.kv.used)
        return nt

    monkeypatch.setattr(replica_mod.Replica, "boundary", checked_boundary)
    table = poisson_trace(300, rate=6.0, seed=7, input_mean=800, output_mean=300)
    req, series, summary = run_sim(tmp_path, table, cfg)
    total = summary["kv_blocks"]["r0"]
    assert total == 631
    assert summary["preemptions"] > 0 and sum(req.column("preemptions").to_pylist()) == summary["preemptions"]
    assert max(checked) > 0.9 * total
    ok = by_request_id(req.filter(pa.compute.equal(req.column("status"), "ok")))
    assert ok.column("output_tokens").to_pylist() == ok.column("requested_output_tokens").to_pylist()
    for row in ok.to_pylist():
        times = _token_times(row["token_times"])
        assert len(times) == row["output_tokens"] and np.all(np.diff(times) > 0)
    used = np.array(series.column("kv_blocks_used").to_pylist())
    assert used.max() <= total and used.min() >= 0


def _blocks_held(rep, r) -> int:
    if r.step0 >= 0:
        return -(-(r.ctx0 + rep.step - r.step0 + 1) // rep.bs)
    return r.blocks


def test_requests_that_never_fit_are_rejected_with_a_reason(tmp_path, tiny_kv_catalog):
    cfg = ClusterConfig.build(replicas=1, gpu="tiny-gpu", gpu_memory_utilization=1.0, catalogs=(tiny_kv_catalog,),
                              max_model_len=16384, max_num_batched_tokens=8192, max_num_seqs=256)
    # 631 blocks of 16 tokens = 10096 KV slots
    table = trace(np.array([0.0, 0.1, 0.2, 0.3, 0.4]), [100, 10000, 20000, 100, 9000], [10, 100, 10, 0, 1000])
    req = by_request_id(run_sim(tmp_path, table, cfg)[0])
    status = req.column("status").to_pylist()
    errors = req.column("error").to_pylist()
    assert status == ["ok", "rejected", "rejected", "rejected", "ok"]
    assert "KV blocks" in errors[1] and "maximum model length 16384" in errors[2] and ">= 1" in errors[3]
    assert req.column("first_token_s").to_pylist()[1:4] == [None, None, None]
    assert req.column("output_tokens").to_pylist()[4] == 1000


def test_decode_runs_sum_to_the_step_by_step_time(tmp_path):
    """A lone request: prefill step + (output - 1) decode steps, each from the roofline at its own context.
    The simulator advances the decode steps as runs timed at their mean context; the smooth roofline
    is nearly linear in the context within a run, so the total matches to a few parts per million."""
    cfg = ClusterConfig.build(replicas=1, max_num_batched_tokens=8192)
    req = run_sim(tmp_path, trace(np.array([0.0]), 3000, 2000), cfg)[0].to_pylist()[0]
    cost = CostModel(cfg.model_spec, cfg.gpu_spec, 1)
    expected = cost.step(3000, 3000 * (3000 + 1) / 2, 3000, 0, 0, 1).total
    expected += sum(cost.decode_time(1, 3000 + j + 1) for j in range(1999))
    assert req["last_token_s"] == pytest.approx(expected, rel=1e-6)
    assert req["first_token_s"] == pytest.approx(cost.step(3000, 3000 * 3001 / 2, 3000, 0, 0, 1).total)


def test_chunked_prefill_splits_long_prompts_and_off_waits_for_room(tmp_path):
    table = trace(np.array([0.0]), 20000, 5)
    cfg = ClusterConfig.build(replicas=1, model="qwen2.5-7b", max_num_batched_tokens=4096, max_num_seqs=4)
    row = run_sim(tmp_path, table, cfg, run_id="chunked")[0].to_pylist()[0]
    assert row["status"] == "ok"
    # five chunks of at most 4096 tokens: the first token comes after 5 steps
    cost = CostModel(cfg.model_spec, cfg.gpu_spec, 1, max_num_batched_tokens=4096, max_num_seqs=4)
    one_step = cost.step(4096, 4096 * 4097 / 2, 4096, 0, 0, 0).total
    assert row["first_token_s"] > 4 * one_step
    off = ClusterConfig.build(replicas=1, model="qwen2.5-7b", max_num_batched_tokens=4096, max_num_seqs=4,
                              chunked_prefill=False)
    row = run_sim(tmp_path, table, off, run_id="unchunked")[0].to_pylist()[0]
    assert row["status"] == "rejected" and "chunked prefill off" in row["error"]


def test_router_view_sees_replica_signals(tmp_path):
    seen = []

    class Spy:
        name = "spy"

        def choose(self, req, view):
            seen.append((view.now, list(view.outstanding_requests), list(view.running), list(view.kv_usage)))
            return 0

        def on_complete(self, req, target, view):
            return None

    from llmlb_bench.sim import simulate
    from llmlb_bench.store import RunStore

    table = trace(np.arange(50) * 0.01, 500, 200)
    with RunStore(tmp_path, config={}, backend="sim", run_id="spy") as run:
        simulate(table, ClusterConfig.build(replicas=2), Spy(), run)
    assert [s[1][0] for s in seen] == list(range(50)), "own accounting: one more outstanding per dispatch"
    assert max(s[2][0] for s in seen) > 10 and max(s[3][0] for s in seen) > 0
    assert all(s[1][1] == 0 for s in seen)


def test_bad_policy_choice_is_a_user_error(tmp_path):
    from llmlb_bench.errors import UserError
    from llmlb_bench.sim import simulate
    from llmlb_bench.store import RunStore

    class Bad:
        name = "bad"

        def choose(self, req, view):
            return 7

        def on_complete(self, req, target, view):
            return None

    with pytest.raises(UserError, match="chose target 7"):
        with RunStore(tmp_path, config={}, backend="sim", run_id="bad") as run:
            simulate(trace(np.array([0.0]), 10, 10), ClusterConfig.build(replicas=2), Bad(), run)


@pytest.mark.parametrize("policy", ["least_outstanding", "fcfs_queue"])
def test_a_finished_run_leaves_no_cycles_behind(tmp_path, policy):
    """The simulator pauses the collector while it runs; its objects are linked in cycles through the
    backend's and the router's callbacks until the run detaches them (trace_run.TraceRun.detach). Left
    in place, every trace-length list stayed allocated until a later collection, which then cost
    whatever ran next a traversal of them (17-54 ms of a 100k-request run's report)."""
    import gc

    from llmlb_bench.policies.router import Router
    from llmlb_bench.sim.simulation import Simulation
    from llmlb_bench.trace_columns import TraceColumns
    from llmlb_bench.trace_run import TraceRun
    from llmlb_bench.trace_schedule import TraceSchedule

    table = poisson_trace(300, rate=40.0, seed=2)
    gc.collect()
    gc.disable()
    try:
        run_sim(tmp_path, table, ClusterConfig.build(replicas=2), policy=policy)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = {type(o).__name__ for o in gc.garbage
                if isinstance(o, (Simulation, TraceRun, Router, TraceSchedule, TraceColumns))}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == set()

