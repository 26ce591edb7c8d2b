"""Simulator features: energy, prefix caching, router holds and rejects, dependent arrivals,
heterogeneous pools, prefill/decode disaggregation, failures, compact token times."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.policies.hetero import PrefillDecodePair
from llmlb_bench.sim import ClusterConfig, load_catalog, simulate
from llmlb_bench.sim.scheduling import EngineScheduler
from llmlb_bench.store import RunStore
from sim_helpers import by_request_id, poisson_trace, run_sim, trace
from test_sim_core import tiny_kv_catalog  # noqa: F401  (fixture)


def _tokens(row: dict) -> np.ndarray:
    return np.concatenate([s["start_s"] + s["gap_s"] * np.arange(s["count"]) for s in row["token_times"]])


# ---- energy ------------------------------------------------------------------------------------

def test_energy_is_conserved_and_power_stays_within_the_board_limits(tmp_path):
    cfg = ClusterConfig.build(replicas=2)
    req, series, summary = run_sim(tmp_path, poisson_trace(400, rate=8.0, seed=2), cfg)
    gpu = load_catalog().gpus["a100-80g"]
    # every joule of every busy step is attributed to some request; idle time is not
    busy_s = summary["mean_utilization"] * summary["sim_time_s"] * 2
    idle_j = gpu.idle_w * (summary["sim_time_s"] * 2 - busy_s)
    assert summary["attributed_energy_j"] == pytest.approx(summary["energy_j"] - idle_j, rel=1e-9)
    assert sum(req.column("energy_j").to_pylist()) == pytest.approx(summary["attributed_energy_j"], rel=1e-9)
    power = np.array(series.column("power_w").to_pylist())
    assert power.min() >= gpu.idle_w - 1e-6 and power.max() <= gpu.max_w + 1e-6
    # integrating the sampled power gives the total energy (up to the last partial interval)
    per_tick = series.group_by("t_s").aggregate([("power_w", "sum")]).sort_by("t_s")
    integral = float(np.sum(per_tick.column("power_w_sum").to_numpy()[1:]))
    assert integral == pytest.approx(summary["energy_j"], rel=0.02)
    assert summary["cost_usd"] == pytest.approx(2 * gpu.price_per_hour * summary["sim_time_s"] / 3600)


def test_longer_outputs_cost_more_energy(tmp_path):
    cfg = ClusterConfig.build(replicas=1)
    table = trace(np.array([0.0, 100.0]), [500, 500], [50, 500])
    energy = by_request_id(run_sim(tmp_path, table, cfg)[0]).column("energy_j").to_pylist()
    assert 5 < energy[1] / energy[0] < 12


# ---- prefix caching ----------------------------------------------------------------------------------

def _shared_prefix_trace(n: int, prefix_blocks: int, own_blocks: int, gap_s: float) -> pa.Table:
    """Every prompt = one shared prefix of ``prefix_blocks`` blocks + its own blocks (block size 16)."""
    shared = list(range(1, prefix_blocks + 1))
    hashes = [shared + [10_000 * (i + 1) + k for k in range(own_blocks)] for i in range(n)]
    t = trace(np.arange(n) * gap_s, 16 * (prefix_blocks + own_blocks), 20,
              prefix_hashes=pa.array(hashes, pa.list_(pa.uint64())))
    return t


def test_prefix_caching_skips_shared_prefill_and_cuts_ttft(tmp_path):
    table = _shared_prefix_trace(40, prefix_blocks=200, own_blocks=8, gap_s=0.5)
    on = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(replicas=1), run_id="on")[0])
    off = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(replicas=1, enable_prefix_caching=False),
                                run_id="off")[0])
    cached = on.column("cached_tokens").to_pylist()
    assert cached[0] == 0 and all(c == 200 * 16 for c in cached[1:])
    assert set(off.column("cached_tokens").to_pylist()) == {0}
    ttft = lambda t: (pc.subtract(t.column("first_token_s"), t.column("sent_s"))).to_numpy()  # noqa: E731
    assert np.median(ttft(on)[1:]) < 0.3 * np.median(ttft(off)[1:])


def test_next_turn_of_a_conversation_hits_the_cached_reply(tmp_path):
    """Turn 2's prompt = turn 1's prompt + reply + a new message; the engine cached the reply's KV."""
    def hashes(length: int) -> list[int]:          # chained hashes of one conversation: named by end position
        return [7_000_000 + min(end, length) for end in range(16, length + 16, 16)]

    table = trace(np.array([0.0, 0.0, 100.0]), [1000, 1256, 1256], [200, 10, 10],
                  parent_id=pa.array([None, 0, None], pa.int64()),
                  after_parent_s=pa.array([None, 1.0, None], pa.float64()),
                  prefix_hashes=pa.array([hashes(1000), hashes(1256), [1, 2, 3]], pa.list_(pa.uint64())))
    req = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(replicas=1))[0])
    # 1000 + 200 - 1 tokens of KV -> 74 full blocks, of which the prompt had 62
    assert req.column("cached_tokens").to_pylist() == [0, 74 * 16, 0]
    # a reply that opens with reasoning: its KV after the prompt holds the reasoning, which the next
    # turn's history leaves out, so only the prompt's 62 full blocks are shared
    reasoned = table.set_column(table.schema.get_field_index("reasoning_tokens"), "reasoning_tokens", pa.array([150, 0, 0], pa.int32()))
    req = by_request_id(run_sim(tmp_path, reasoned, ClusterConfig.build(replicas=1), run_id="reasoned")[0])
    assert req.column("cached_tokens").to_pylist() == [0, 62 * 16, 0]


def test_engine_block_size_coarser_than_the_trace_hashes(tmp_path):
    table = _shared_prefix_trace(10, prefix_blocks=64, own_blocks=4, gap_s=0.5)   # 16-token hashes
    req = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(replicas=1, block_size=32))[0])
    assert req.column("cached_tokens").to_pylist()[1:] == [64 * 16] * 9


def test_view_publishes_exact_cache_contents(tmp_path):
    from llmlb_bench.sim import simulate
    from llmlb_bench.store import RunStore

    seen = []

    class Spy:
        name = "spy"

        def choose(self, req, view):
            seen.append([view.cached_prefix(i, req.prefix_hashes) for i in range(len(view))])
            return 0

        def on_complete(self, req, target, view):
            return None

    table = _shared_prefix_trace(5, prefix_blocks=10, own_blocks=2, gap_s=1.0)
    with RunStore(tmp_path, config={}, backend="sim", run_id="spy") as run:
        simulate(table, ClusterConfig.build(replicas=2), Spy(), run)
    assert seen[0] == [0, 0] and all(s == [10, 0] for s in seen[1:])


# ---- the router's answers ---------------------------------------------------------------------------

def test_router_queue_holds_requests_and_releases_them(tmp_path):
    from llmlb_bench.policies import make_policy
    from llmlb_bench.sim import simulate
    from llmlb_bench.store import RunStore
    import pyarrow.parquet as pq

    table = trace(np.arange(40) * 0.01, 300, 100)
    with RunStore(tmp_path, config={}, backend="sim", run_id="q") as run:
        simulate(table, ClusterConfig.build(replicas=2), make_policy("fcfs_queue", {"max_outstanding": 3}), run)
    req = by_request_id(pq.read_table(run.dir / "requests.parquet"))
    assert req.column("status").to_pylist() == ["ok"] * 40
    held = pc.greater(req.column("sent_s"), req.column("scheduled_s"))
    assert pc.sum(held).as_py() >= 30, "most requests waited at the router"
    # never more than 3 in flight per target: sends happen only after completions
    sent = np.sort(req.column("sent_s").to_numpy())
    ends = np.sort(req.column("last_token_s").to_numpy())
    assert all(np.searchsorted(ends, s, side="right") >= i - 6 + 1 for i, s in enumerate(sent) if i >= 6)


def test_router_rejections_are_rows_with_a_reason(tmp_path):
    table = trace(np.arange(30) * 0.001, 300, 300)
    req = run_sim(tmp_path, table, ClusterConfig.build(replicas=1), policy="admission_control")[0]
    # default limit 128 in flight: all admitted; a limit of 5 rejects the burst's tail
    assert set(req.column("status").to_pylist()) == {"ok"}
    from llmlb_bench.policies import make_policy
    from llmlb_bench.sim import simulate
    from llmlb_bench.store import RunStore
    import pyarrow.parquet as pq

    with RunStore(tmp_path, config={}, backend="sim", run_id="ac") as run:
        simulate(table, ClusterConfig.build(replicas=1), make_policy("admission_control", {"max_outstanding": 5}), run)
    req = by_request_id(pq.read_table(run.dir / "requests.parquet"))
    status = req.column("status").to_pylist()
    assert status[:5] == ["ok"] * 5 and status.count("rejected") == 25
    rejected = req.filter(pc.equal(req.column("status"), "rejected"))
    assert set(rejected.column("error").to_pylist()) == {"rejected by the router (admission_control)"}
    assert rejected.column("target").null_count == 25 and rejected.column("sent_s").null_count == 25


# ---- dependent arrivals ---------------------------------------------------------------------------------

def test_children_start_after_their_parent_plus_think_time(tmp_path):
    table = trace(np.zeros(4), 200, [100, 50, 50, 10],
                  parent_id=pa.array([None, 0, 1, 0], pa.int64()),
                  after_parent_s=pa.array([None, 2.0, 0.5, 0.0], pa.float64()))
    req = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(replicas=2))[0]).to_pylist()
    assert req[1]["scheduled_s"] == pytest.approx(req[0]["last_token_s"] + 2.0)
    assert req[2]["scheduled_s"] == pytest.approx(req[1]["last_token_s"] + 0.5)
    assert req[3]["scheduled_s"] == pytest.approx(req[0]["last_token_s"])
    assert all(r["sent_s"] == r["scheduled_s"] for r in req)


def test_a_child_never_comes_before_its_own_arrival_time(tmp_path):
    table = trace(np.array([0.0, 50.0]), 100, 10, parent_id=pa.array([None, 0], pa.int64()),
                  after_parent_s=pa.array([None, 0.1], pa.float64()))
    req = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(replicas=1))[0]).to_pylist()
    assert req[1]["scheduled_s"] == 50.0


# ---- heterogeneous pools ----------------------------------------------------------------------------------

def test_heterogeneous_pools_serve_at_their_own_speed(tmp_path):
    cfg = ClusterConfig.build(pools=[{"name": "fast", "replicas": 1, "gpu": "h100-sxm"},
                               {"name": "slow", "replicas": 1, "gpu": "a100-80g"}])
    assert cfg.replicas == 2
    table = trace(np.arange(2) * 0.0, 1000, 500)
    req = by_request_id(run_sim(tmp_path, table, cfg, policy="round_robin")[0]).to_pylist()
    assert [r["target"] for r in req] == ["r0", "r1"]
    e2e = [r["last_token_s"] - r["sent_s"] for r in req]
    assert e2e[0] < 0.75 * e2e[1]


def test_engine_defaults_follow_vllm_per_gpu_class():
    pools = {p.gpu: p for p in ClusterConfig.build(pools=[{"name": "a", "gpu": "a100-80g"}, {"name": "h", "gpu": "h100-sxm"},
                                                    {"name": "l", "gpu": "l4"}]).pools}
    assert (pools["a100-80g"].max_num_batched_tokens, pools["a100-80g"].max_num_seqs) == (2048, 256)
    assert (pools["h100-sxm"].max_num_batched_tokens, pools["h100-sxm"].max_num_seqs) == (8192, 1024)
    assert (pools["l4"].max_num_batched_tokens, pools["l4"].max_num_seqs) == (2048, 256)
    unchunked = ClusterConfig.build(chunked_prefill=False).pools[0]
    assert unchunked.max_num_batched_tokens == 8192, "the model length, so any prompt fits one step"
    assert ClusterConfig.build(max_num_seqs=64).pools[0].max_num_seqs == 64


def test_pool_settings_are_validated():
    with pytest.raises(UserError, match="unknown field 'gpus' \\(did you mean 'gpu'\\?\\)") as e:
        ClusterConfig.build(pools=[{"gpus": "h100-sxm"}])
    assert e.value.where == "cluster.pools[0]"
    with pytest.raises(UserError, match="unknown GPU") as e:
        ClusterConfig.build(pools=[{"replicas": 1}, {"gpu": "x"}])
    assert e.value.where == "cluster.pools[1].gpu"
    with pytest.raises(UserError, match="needs both a prefill and a decode pool"):
        ClusterConfig.build(pools=[{"name": "prefill"}])
    cfg = ClusterConfig.build(pools=[{"name": "a", "replicas": 2}, {"name": "b", "replicas": 3, "tp": 2}])
    assert ClusterConfig.from_dict(cfg.to_dict()) == cfg


# ---- prefill/decode disaggregation ---------------------------------------------------------------------------

PD = ClusterConfig.build(pools=[{"name": "prefill", "replicas": 1}, {"name": "decode", "replicas": 2}],
                         kv_link_gb_s=25.0, kv_link_latency_ms=2.0)


def test_disaggregated_requests_prefill_on_one_pool_and_decode_on_the_other(tmp_path):
    table = poisson_trace(60, rate=4.0, seed=4)
    req = by_request_id(run_sim(tmp_path, table, PD, policy="pd_pair")[0])
    assert set(req.column("status").to_pylist()) == {"ok"}
    assert set(req.column("prefill_target").to_pylist()) == {"r0"}
    assert set(req.column("decode_target").to_pylist()) == {"r1", "r2"}
    assert req.column("output_tokens").to_pylist() == table.column("output_tokens").to_pylist()
    kv_per_token = load_catalog().models["llama-3-8b"].kv_bytes_per_token
    for row in req.to_pylist():
        times = _tokens(row)
        assert len(times) == row["output_tokens"] and times[0] == row["first_token_s"]
        if row["output_tokens"] > 1:
            # the second token waits at least for the KV transfer
            transfer = row["input_tokens"] * kv_per_token / 25e9 + 0.002
            assert times[1] - times[0] >= transfer


class _SeesBooks(PrefillDecodePair):
    """pd_pair that records, at each decision, its time and the router's own count of requests per target."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, tuple[int, ...]]] = []

    def choose_pair(self, req, view):
        self.view = view
        self.seen.append((view.now, tuple(view.outstanding_requests)))
        return super().choose_pair(req, view)


def test_the_router_books_each_leg_on_its_own_target_until_the_hand_over_and_the_end(tmp_path):
    """At every decision of a disaggregated run, the view's outstanding requests of each target are the
    prefill legs the rows place there (sent, prefill not yet handed over) plus the decode legs (handed
    over, not yet ended): the decode leg is booked at the hand-over (TraceRun.handed_over), the prefill
    leg leaves its target there, and every book is closed at the end."""
    policy = _SeesBooks()
    with RunStore(tmp_path, config={}, backend="sim", run_id="pd") as run:
        simulate(poisson_trace(80, rate=6.0, seed=7), PD, policy, run)
    rows = pq.read_table(run.dir / "requests.parquet").to_pylist()
    assert {r["status"] for r in rows} == {"ok"} and len(policy.seen) == 80
    names = ["r0", "r1", "r2"]
    handed_over = 0
    for now, books in policy.seen:
        expected = [0, 0, 0]
        for r in rows:
            if r["sent_s"] < now < r["first_token_s"]:
                expected[names.index(r["prefill_target"])] += 1
            elif r["first_token_s"] <= now < r["last_token_s"]:
                expected[names.index(r["decode_target"])] += 1
                handed_over += 1
        assert list(books) == expected, now
    assert handed_over > 0       # some decisions saw decode legs in flight
    assert policy.view.outstanding_requests == (0, 0, 0)   # every leg closed at its end


def test_disaggregation_needs_a_pair_policy(tmp_path):
    with pytest.raises(UserError, match="choose_pair"):
        run_sim(tmp_path, poisson_trace(5, 1.0), PD, policy="round_robin")


# ---- failures ------------------------------------------------------------------------------------------

def test_failed_replica_requests_are_retried_elsewhere(tmp_path):
    cfg = ClusterConfig.build(replicas=2, failures=[{"target": "r0", "at_s": 5.0, "down_s": 1000.0}])
    table = poisson_trace(200, rate=10.0, seed=6)
    req, _, summary = run_sim(tmp_path, table, cfg, policy="least_outstanding")
    assert set(req.column("status").to_pylist()) == {"ok"}
    assert summary["retries"] > 0 and summary["failures"] == 1
    late = req.filter(pc.greater(req.column("last_token_s"), 5.0))
    assert set(late.column("target").to_pylist()) == {"r1"}


def test_failure_mode_fail_reports_errors(tmp_path):
    cfg = ClusterConfig.build(replicas=2, failures=[{"target": "r0", "at_s": 5.0, "down_s": 3.0}], on_failure="fail")
    req, _, summary = run_sim(tmp_path, poisson_trace(200, rate=10.0, seed=6), cfg, policy="round_robin")
    errors = req.filter(pc.equal(req.column("status"), "error"))
    assert errors.num_rows > 0 and summary["status"]["error"] == errors.num_rows
    assert set(errors.column("error").to_pylist()) == {"replica r0 failed"}, "round robin skips the down target"
    assert errors.column("target").to_pylist() == ["r0"] * errors.num_rows


def test_sending_to_a_down_target_is_an_error(tmp_path):
    from llmlb_bench.sim import simulate
    from llmlb_bench.store import RunStore
    import pyarrow.parquet as pq

    class Always0:
        name = "always0"

        def choose(self, req, view):
            return 0

        def on_complete(self, req, target, view):
            return None

    cfg = ClusterConfig.build(replicas=2, failures=[{"target": "r0", "at_s": 1.0, "down_s": 2.0}], on_failure="fail")
    with RunStore(tmp_path, config={}, backend="sim", run_id="down") as run:
        simulate(trace(np.array([0.5, 1.5, 2.5, 3.5]), 100, 2000), cfg, Always0(), run)
    req = by_request_id(pq.read_table(run.dir / "requests.parquet"))
    assert req.column("status").to_pylist() == ["error", "error", "error", "ok"]
    assert req.column("error").to_pylist()[:3] == ["replica r0 failed", "target r0 is down", "target r0 is down"]


def test_random_failures_follow_the_seed(tmp_path):
    cfg = ClusterConfig.build(replicas=3, mtbf_s=20.0, mttr_s=5.0)
    table = poisson_trace(300, rate=10.0, seed=8)
    a = run_sim(tmp_path, table, cfg, seed=1, run_id="a")
    b = run_sim(tmp_path, table, cfg, seed=1, run_id="b")
    c = run_sim(tmp_path, table, cfg, seed=2, run_id="c")
    assert a[2]["failures"] > 0
    assert a[0].drop(["run_id"]).equals(b[0].drop(["run_id"]))
    assert not a[0].drop(["run_id"]).equals(c[0].drop(["run_id"]))


# ---- compact token times ----------------------------------------------------------------------------------

def test_summary_token_times_keep_first_last_and_count(tmp_path):
    table = poisson_trace(200, rate=10.0, seed=9)
    full = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(replicas=2), run_id="full")[0])
    small = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(replicas=2, token_times="summary"),
                                  run_id="small")[0])
    for col in ("first_token_s", "last_token_s", "output_tokens", "energy_j"):
        assert small.column(col).equals(full.column(col))
    for row in small.to_pylist():
        assert len(row["token_times"]) == 1
        times = _tokens(row)
        assert times[-1] == pytest.approx(row["last_token_s"]) and len(times) == row["output_tokens"]


# ---- engine-level scheduling --------------------------------------------------------------------------------

def _service_order(req: pa.Table) -> list[int]:
    return [r["request_id"] for r in sorted(req.to_pylist(), key=lambda r: r["first_token_s"])]


def test_priority_scheduling_admits_urgent_requests_first(tmp_path):
    # one seat: the first request runs, the other four queue; priorities 0 (urgent) .. 2
    table = trace(np.arange(5) * 0.001, 200, 50, priority=pa.array([2, 2, 1, 2, 0], pa.int8()))
    fcfs = run_sim(tmp_path, table, ClusterConfig.build(replicas=1, max_num_seqs=1), run_id="fcfs")[0]
    prio = run_sim(tmp_path, table, ClusterConfig.build(replicas=1, max_num_seqs=1, scheduler="priority"),
                   run_id="prio")[0]
    assert _service_order(fcfs) == [0, 1, 2, 3, 4]
    assert _service_order(prio) == [0, 4, 2, 1, 3]


def test_priority_scheduling_preempts_the_least_urgent(tmp_path, tiny_kv_catalog):  # noqa: F811
    cfg = dict(replicas=1, gpu="tiny-gpu", gpu_memory_utilization=1.0, catalogs=(tiny_kv_catalog,),
               max_num_batched_tokens=8192, max_num_seqs=256)
    # three long requests that cannot all keep growing in 631 blocks; the middle one is least urgent
    table = trace(np.array([0.0, 0.01, 0.02]), 2000, 2000, priority=pa.array([0, 5, 0], pa.int8()))
    fcfs = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(**cfg), run_id="f")[0])
    prio = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(**cfg, scheduler="priority"), run_id="p")[0])
    assert fcfs.column("preemptions").to_pylist()[2] > 0, "FCFS preempts the newest"
    p = prio.column("preemptions").to_pylist()
    assert p[1] > 0 and p[0] == p[2] == 0, "priority preempts the least urgent"


class NotAScheduler:
    """Named by a dotted path but not an EngineScheduler: refused."""


class SPF(EngineScheduler):
    """A user's engine scheduler, loaded by dotted path: shortest prompt first."""

    name = "spf"
    fcfs = False

    def __init__(self, starvation_s: float = 1e9) -> None:
        self.starvation_s = starvation_s

    def pick(self, waiting, now):
        return min(range(len(waiting)), key=lambda i: waiting[i].prompt)


def test_custom_engine_scheduler_by_dotted_path(tmp_path):
    table = trace(np.arange(4) * 0.001, [300, 900, 100, 500], 20)
    cfg = ClusterConfig.build(replicas=1, max_num_seqs=1, scheduler="test_sim_features:SPF",
                              scheduler_args={"starvation_s": 5.0})
    assert ClusterConfig.from_dict(cfg.to_dict()) == cfg
    req = run_sim(tmp_path, table, cfg)[0]
    assert _service_order(req) == [0, 2, 3, 1]
    with pytest.raises(UserError, match="unknown engine scheduler 'lifo'"):
        ClusterConfig.build(scheduler="lifo")
    with pytest.raises(UserError, match="not an EngineScheduler"):
        ClusterConfig.build(scheduler="test_sim_features:NotAScheduler")
    with pytest.raises(UserError, match="unexpected keyword"):
        ClusterConfig.build(scheduler="test_sim_features:SPF", scheduler_args={"x": 1})


# ---- autoscaling ---------------------------------------------------------------------------------------------

def _two_bursts() -> pa.Table:
    """A busy minute, a quiet minute, a busy minute."""
    rng = np.random.default_rng(11)
    busy1 = np.sort(rng.uniform(0, 60, 1200))
    busy2 = np.sort(rng.uniform(120, 180, 1200))
    return trace(np.concatenate([busy1, busy2]), 400, 200)


AUTOSCALE = {"policy": "concurrency", "interval_s": 2.0, "cold_start_s": 10.0,
             "args": {"target": 16, "min_replicas": 1, "max_replicas": 6}}


def test_autoscaler_adds_replicas_under_load_and_retires_them_after(tmp_path):
    cfg = ClusterConfig.build(replicas=1, autoscale=AUTOSCALE)
    assert ClusterConfig.from_dict(cfg.to_dict()) == cfg
    req, series, summary = run_sim(tmp_path, _two_bursts(), cfg)
    assert set(req.column("status").to_pylist()) == {"ok"}
    grown = summary["replicas"]
    assert grown["added"] >= 3 and grown["retired"] >= 1
    # a new replica gets work only after its cold start
    first_use = {}
    for r in req.to_pylist():
        first_use[r["target"]] = min(first_use.get(r["target"], np.inf), r["sent_s"])
    born = series.group_by("target").aggregate([("t_s", "min")]).to_pylist()
    born = {b["target"]: b["t_s_min"] for b in born}
    for name, t in first_use.items():
        if name != "r0":
            assert t >= born[name] + 10.0 - 1.0   # created between samples: up to one interval earlier
    # the fleet costs less than keeping the peak size for the whole run
    peak = 1 + grown["added"]
    assert summary["gpu_hours"] < 0.8 * peak * summary["sim_time_s"] / 3600
    # retired replicas stop appearing in the series
    last = {b["target"]: b["t_s_max"] for b in series.group_by("target").aggregate([("t_s", "max")]).to_pylist()}
    assert min(last.values()) < summary["sim_time_s"] - 5


def test_autoscaling_is_deterministic_and_beats_a_fixed_small_fleet(tmp_path):
    table = _two_bursts()
    a = run_sim(tmp_path, table, ClusterConfig.build(replicas=1, autoscale=AUTOSCALE), run_id="a")
    b = run_sim(tmp_path, table, ClusterConfig.build(replicas=1, autoscale=AUTOSCALE), run_id="b")
    fixed = run_sim(tmp_path, table, ClusterConfig.build(replicas=1), run_id="fixed")
    assert a[0].drop(["run_id"]).equals(b[0].drop(["run_id"]))
    e2e = lambda t: np.mean(pc.subtract(t.column("last_token_s"), t.column("sent_s")).to_numpy())  # noqa: E731
    assert e2e(a[0]) < 0.5 * e2e(fixed[0])


class FixedSchedule:
    """Not an Autoscaler: refused."""


def test_autoscale_settings_are_validated():
    with pytest.raises(UserError, match="unknown field 'every'"):
        ClusterConfig.build(autoscale={"every": 3})
    with pytest.raises(UserError, match="unknown autoscaler 'hpa'"):
        ClusterConfig.build(autoscale={"policy": "hpa"})
    with pytest.raises(UserError, match="not an Autoscaler"):
        ClusterConfig.build(autoscale={"policy": "test_sim_features:FixedSchedule"})
    with pytest.raises(UserError, match="min_replicas"):
        ClusterConfig.build(autoscale={"args": {"min_replicas": 3, "max_replicas": 2}})
    with pytest.raises(UserError, match="unknown pool 'gpu'"):
        ClusterConfig.build(autoscale={"args": {"pool": "gpu"}})
