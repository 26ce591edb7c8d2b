"""Engine-level schedulers: each one's decision rule, observed as the order in which one
replica serves a queue it cannot admit at once (one seat), plus VTC's counters."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.policies import make_policy
from llmlb_bench.policies.schedulers import ENGINE_SCHEDULERS
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.simulation import Simulation
from llmlb_bench.store import RunStore
from sim_helpers import by_request_id, run_sim, trace
from test_sim_core import tiny_kv_catalog  # noqa: F401  (fixture)


def _order(tmp_path, table, run_id="s", **cfg) -> list[int]:
    req = run_sim(tmp_path, table, ClusterConfig.build(replicas=1, max_num_seqs=1, **cfg), run_id=run_id)[0]
    return [r["request_id"] for r in sorted(req.to_pylist(), key=lambda r: r["first_token_s"])]


def _tenants(names: str) -> pa.Array:
    return pa.array(list(names)).dictionary_encode()


def test_sjf_with_a_perfect_predictor_serves_shortest_first(tmp_path):
    # request 0 takes the seat; the rest queue behind it
    table = trace(np.arange(5) * 0.001, 100, [50, 400, 10, 200, 30])
    assert _order(tmp_path, table, "fcfs") == [0, 1, 2, 3, 4]
    sjf = _order(tmp_path, table, "sjf", scheduler="sjf", scheduler_args={"tau": 1.0, "aging": 0.0})
    assert sjf == [0, 2, 4, 3, 1]


def test_sjf_aging_bounds_how_long_a_long_job_is_overtaken(tmp_path):
    # one seat; a 2000-token job queues at t = 0.01; 10-token jobs arrive every 0.05 s, faster
    # than they are served, so a backlog of short jobs lasts as long as they keep coming
    n = 80
    arrival = np.concatenate([[0.0, 0.01], 0.02 + 0.05 * np.arange(n)])
    table = trace(arrival, 50, np.concatenate([[100, 2000], np.full(n, 10)]))

    def shorts_before_long(aging: float) -> int:
        req = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(
            replicas=1, max_num_seqs=1, scheduler="sjf", scheduler_args={"tau": 1.0, "aging": aging}),
            run_id=f"a{aging}")[0])
        first = req.column("first_token_s").to_numpy()
        return int(np.sum(first[2:] < first[1]))

    assert shorts_before_long(0.0) == n, "pure SJF starves the long job while short ones wait"
    # key = prediction + aging x arrival: short j (arrival 0.02 + 0.05 j) goes first while
    # 10 + 4000 (0.02 + 0.05 j) < 2000 + 4000 x 0.01, i.e. for j = 0..9
    assert shorts_before_long(4000.0) == 10


def test_sjf_predictions_follow_the_oracle_and_are_drawn_once(tmp_path):
    # with tau = 0 the order is unrelated to the lengths but still deterministic
    table = trace(np.arange(30) * 0.001, 100, np.arange(30, 0, -1) * 10)
    a = _order(tmp_path, table, "a", scheduler="sjf", scheduler_args={"tau": 0.0, "aging": 0.0, "seed": 3})
    b = _order(tmp_path, table, "b", scheduler="sjf", scheduler_args={"tau": 0.0, "aging": 0.0, "seed": 3})
    c = _order(tmp_path, table, "c", scheduler="sjf", scheduler_args={"tau": 0.0, "aging": 0.0, "seed": 4})
    assert a == b != c
    assert sorted(a) == list(range(30))


def test_deadline_scheduler_serves_the_earliest_ttft_deadline(tmp_path):
    slo = pa.array(["batch", "batch", "interactive", "batch", "interactive", "other"]).dictionary_encode()
    table = trace(np.arange(6) * 0.01, 100, 20, slo_class=slo)
    # deadlines: batch 60 s, interactive 0.5 s, others deadline_s = 1 s
    order = _order(tmp_path, table, "d", scheduler="deadline",
                   scheduler_args={"deadlines": "interactive=0.5,batch=60", "deadline_s": 1.0})
    assert order == [0, 2, 4, 5, 1, 3]


def test_deadline_scheduler_preempts_the_latest_deadline(tmp_path, tiny_kv_catalog):  # noqa: F811
    cfg = dict(replicas=1, gpu="tiny-gpu", gpu_memory_utilization=1.0, catalogs=(tiny_kv_catalog,),
               max_num_batched_tokens=8192, max_num_seqs=256)
    slo = pa.array(["tight", "loose", "tight"]).dictionary_encode()
    table = trace(np.array([0.0, 0.01, 0.02]), 2000, 2000, slo_class=slo)
    req = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(
        **cfg, scheduler="deadline", scheduler_args={"deadlines": "tight=1,loose=100"}), run_id="p")[0])
    p = req.column("preemptions").to_pylist()
    assert p[1] > 0 and p[0] == p[2] == 0


def test_vtc_alternates_tenants_where_fcfs_serves_in_arrival_order(tmp_path):
    # tenant a sends 4 equal requests, then b sends 2; request 0 (a) takes the only seat
    table = trace(np.arange(6) * 0.001, 100, 20, tenant=_tenants("aaaabb"))
    assert _order(tmp_path, table, "fcfs") == [0, 1, 2, 3, 4, 5]
    # after a0, a's counter is 100 + 2 x 20 and b's 0: b0; then equal counters: the earlier request (a1)
    assert _order(tmp_path, table, "vtc", scheduler="vtc") == [0, 4, 1, 5, 2, 3]


def test_vtc_lifts_a_returning_tenant_instead_of_letting_it_catch_up(tmp_path):
    # a and b are backlogged from t = 0; c arrives at t = 5 s with a burst of 10 requests
    ab = np.arange(60) * 0.001
    arrival = np.concatenate([ab, 5.0 + np.arange(10) * 0.001])
    table = trace(arrival, 100, 50, tenant=_tenants("ab" * 30 + "c" * 10))
    req = run_sim(tmp_path, table, ClusterConfig.build(replicas=1, max_num_seqs=1, scheduler="vtc"))[0]
    rows = sorted(req.to_pylist(), key=lambda r: r["first_token_s"])
    after = [r["tenant"] for r in rows if r["first_token_s"] > 5.0][:12]
    # lifted to the others' counter, c takes its turn with them instead of ten turns in a row
    assert max(len(run) for run in "".join(after).replace("a", " ").replace("b", " ").split()) <= 2
    assert after.count("c") >= 3


def test_vtc_counters_equal_the_weighted_service_delivered(tmp_path, tiny_kv_catalog):  # noqa: F811
    # a small KV cache forces preemptions: prompts must count once, decode tokens exactly
    rng = np.random.default_rng(5)
    n = 40
    table = trace(np.sort(rng.uniform(0, 2, n)), rng.integers(200, 1200, n), rng.integers(50, 900, n),
                  tenant=_tenants("".join(rng.choice(list("xyz"), n))))
    cfg = ClusterConfig.build(replicas=1, gpu="tiny-gpu", gpu_memory_utilization=1.0, catalogs=(tiny_kv_catalog,),
                              max_num_batched_tokens=8192, max_num_seqs=256, scheduler="vtc",
                              scheduler_args={"input_weight": 1.0, "output_weight": 2.0})
    with RunStore(tmp_path, config={}, backend="sim", run_id="v") as run:
        sim = Simulation(table, cfg, make_policy("round_robin"), run, 0)
        sim.run()
        rep = sim.replicas[0]
        assert rep.preemptions > 0
        vtc = rep.scheduler
        for u in "xyz":
            rows = [i for i in range(n) if sim.cols.tenant[i] == u]
            expected = sum(sim.inp[i] + 2 * sim.out[i] for i in rows)
            # lifts only ever add: the counter is the service plus the lifts it received
            assert vtc.counter(u) >= expected
            assert vtc._decoding.get(u, 0) == 0
        sim.recorder.flush()
        sim.sampler.flush()


def test_vtc_without_lifts_counts_exactly(tmp_path):
    # one tenant: no lifts, so the counter is exactly the weighted tokens served
    table = trace(np.arange(20) * 0.05, np.arange(20) * 37 + 100, np.arange(20) * 11 + 5)
    cfg = ClusterConfig.build(replicas=1, max_num_seqs=4, scheduler="vtc", scheduler_args={"output_weight": 3})
    with RunStore(tmp_path, config={}, backend="sim", run_id="v1") as run:
        sim = Simulation(table, cfg, make_policy("round_robin"), run, 0)
        sim.run()
        assert sim.replicas[0].scheduler.counter("default") == sum(
            sim.inp[i] + 3 * sim.out[i] for i in range(20))
        sim.recorder.flush()
        sim.sampler.flush()


def test_schedulers_are_selected_by_name_with_checked_arguments():
    assert list(ENGINE_SCHEDULERS) == ["fcfs", "priority", "sjf", "vtc", "deadline"]
    cfg = ClusterConfig.build(scheduler="sjf", scheduler_args={"tau": 0.9, "aging": 5})
    assert ClusterConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(UserError, match="parameter 'tau' expects float, got 'high'"):
        ClusterConfig.build(scheduler="sjf", scheduler_args={"tau": "high"})
    with pytest.raises(UserError, match=r"tau must be in \[-1, 1\]"):
        ClusterConfig.build(scheduler="sjf", scheduler_args={"tau": 2.0})
    with pytest.raises(UserError, match="unexpected keyword argument 'weights'"):
        ClusterConfig.build(scheduler="vtc", scheduler_args={"weights": "a=2"})
    with pytest.raises(UserError, match="deadlines: expected slo_class=seconds"):
        ClusterConfig.build(scheduler="deadline", scheduler_args={"deadlines": "interactive"})


def test_fcfs_default_is_unchanged_by_naming_it(tmp_path):
    table = trace(np.arange(50) * 0.02, 300, np.arange(50) % 7 * 20 + 10)
    a = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(replicas=2), run_id="a")[0])
    b = by_request_id(run_sim(tmp_path, table, ClusterConfig.build(replicas=2, scheduler="fcfs"), run_id="b")[0])
    assert a.drop(["run_id"]).equals(b.drop(["run_id"]))


def test_cli_selects_the_scheduler_and_records_it_in_run_json(tmp_path, capsys):
    import json

    from llmlb_bench.cli import main
    from llmlb_bench.schema import write_trace

    path = tmp_path / "t.parquet"
    write_trace(trace(np.arange(20) * 0.01, 200, 30, tenant=_tenants("ab" * 10)), path)
    main(["simulate", str(path), "--replicas", "1", "--scheduler", "vtc", "--scheduler-arg", "output_weight=3",
          "--signal-refresh", "0.5", "--results", str(tmp_path / "res"), "--run-id", "v"])
    cluster = json.loads((tmp_path / "res" / "v" / "run.json").read_text())["config"]["cluster"]
    assert (cluster["scheduler"], cluster["scheduler_args"]) == ("vtc", {"output_weight": 3})
    assert cluster["signal_refresh_s"] == 0.5
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["simulate", str(path), "--scheduler", "sjf", "--scheduler-arg", "tau=x",
              "--results", str(tmp_path / "res")])
    assert info.value.code == 2 and "parameter 'tau' expects float" in capsys.readouterr().err
