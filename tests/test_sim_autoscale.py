"""Autoscaling on a step load: the threshold autoscaler grows the fleet when the scraped
queue passes its upper threshold and shrinks it after the load falls; what its cold start
costs in TTFT; energy and GPU-hours cover starting and idle replicas."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.sim import ClusterConfig, load_catalog
from llmlb_bench.policies.base import fill, put
from sim_helpers import run_sim, trace


def _step_load():
    """4 req/s for a minute, 20 req/s for two minutes (about 2x what one 16-seat replica
    serves), then 4 req/s for two minutes."""
    rng = np.random.default_rng(0)

    def poisson(rate, a, b):
        t = a + np.cumsum(rng.exponential(1 / rate, int(rate * (b - a) * 1.5) + 10))
        return t[t < b]

    return trace(np.concatenate([poisson(4, 0, 60), poisson(20, 60, 180), poisson(4, 180, 300)]), 400, 100)


def _autoscale(cold_start_s: float) -> dict:
    return {"policy": "threshold", "interval_s": 5.0, "cold_start_s": cold_start_s,
            "args": {"metric": "queue", "upper": 4.0, "lower": 0.5, "cooldown_s": 20.0, "max_replicas": 4}}


def _ttft(req, start, end):
    sent = req.column("sent_s").to_numpy()
    ttft = req.column("first_token_s").to_numpy() - sent
    return float(ttft[(sent >= start) & (sent < end)].mean())


def test_threshold_autoscaler_follows_a_step_load_and_its_cold_start_costs_ttft(tmp_path):
    table = _step_load()
    cold = run_sim(tmp_path, table, ClusterConfig.build(replicas=1, max_num_seqs=16, autoscale=_autoscale(30.0)), run_id="c")
    warm = run_sim(tmp_path, table, ClusterConfig.build(replicas=1, max_num_seqs=16, autoscale=_autoscale(0.0)), run_id="w")
    fixed = run_sim(tmp_path, table, ClusterConfig.build(replicas=1, max_num_seqs=16), run_id="f")
    req, series, summary = cold
    # the fleet over time, from series.parquet: replicas sampled at each tick
    size = collections.Counter(series.column("t_s").to_pylist())
    assert size[30.0] == 1 and size[120.0] == 4 and size[290.0] == 1   # measured: 1, 2, 3, 4, ..., 2, 1
    assert summary["replicas"] == {"initial": 1, "added": 3, "retired": 3}
    # what the cold start costs: requests arriving in the first 30 s of the step wait for the
    # new replicas (mean TTFT 15.7 s, as without autoscaling) instead of 2.0 s with instant starts
    assert _ttft(req, 60, 90) > 5 * _ttft(warm[0], 60, 90)
    assert _ttft(req, 60, 90) == pytest.approx(_ttft(fixed[0], 60, 90), rel=0.05)
    # later the grown fleet serves the step; a fixed replica never catches up (77 s mean TTFT)
    assert _ttft(req, 90, 180) < 0.1 * _ttft(fixed[0], 90, 180)
    assert _ttft(req, 200, 300) < 0.1 and _ttft(warm[0], 200, 300) < 0.1


def test_energy_and_gpu_hours_cover_starting_and_idle_replicas(tmp_path):
    req, series, summary = run_sim(tmp_path, _step_load(),
                                   ClusterConfig.build(replicas=1, max_num_seqs=16, autoscale=_autoscale(30.0)))
    gpu = load_catalog().gpus["a100-80g"]
    rows = series.to_pylist()
    # integrating every replica's sampled power (1 s intervals) gives the run's energy
    assert sum(r["power_w"] for r in rows if r["t_s"] > 0) == pytest.approx(summary["energy_j"], rel=0.01)
    # a replica in its cold start draws idle power, is billed, and gets no work
    first = {}
    for r in rows:
        first.setdefault(r["target"], r["t_s"])
    added = sorted((t, name) for name, t in first.items() if name != "r0")
    t0, name = added[0]
    cold_rows = [r for r in rows if r["target"] == name and t0 < r["t_s"] <= t0 + 28]
    assert cold_rows and all(r["power_w"] == pytest.approx(gpu.idle_w) for r in cold_rows)
    assert all(r["running"] == r["waiting"] == 0 for r in cold_rows)
    used = {r["target"] for r in req.to_pylist()}
    assert used == set(first), "every added replica served once ready"
    lifetimes = sum(max(r["t_s"] for r in rows if r["target"] == n) - t for n, t in first.items())
    assert summary["gpu_hours"] == pytest.approx(lifetimes / 3600, abs=len(first) * 1.0 / 3600)


def test_threshold_autoscaler_settings_are_checked():
    cfg = ClusterConfig.build(autoscale=_autoscale(10.0))
    assert ClusterConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(UserError, match="metric must be queue or kv"):
        ClusterConfig.build(autoscale={"policy": "threshold", "args": {"metric": "power"}})
    with pytest.raises(UserError, match="lower < upper"):
        ClusterConfig.build(autoscale={"policy": "threshold", "args": {"upper": 0.2, "lower": 0.5}})


def test_threshold_rule_on_a_hand_built_view():
    from llmlb_bench.policies import TargetInfo, View
    from llmlb_bench.sim.autoscale import PoolStatus, ThresholdAutoscaler

    rule = ThresholdAutoscaler(metric="kv", upper=0.8, lower=0.3, step=2, cooldown_s=30.0, max_replicas=4)
    view = View(targets=[TargetInfo(f"r{i}") for i in range(3)], kv_usage=[0.9, 0.85, 0.0])
    pool = {"default": PoolStatus("default", ready=(0, 1), starting=(2,))}   # the starting one is not averaged
    assert rule.decide(0.0, view, pool) == {"default": 4}, "mean 0.875 > 0.8: grow by 2, capped at 4"
    assert rule.decide(20.0, view, pool) == {}, "cooldown"
    fill(view, "kv_usage", [0.1, 0.2, 0.0])
    assert rule.decide(30.0, view, pool) == {"default": 2}, "mean 0.15 < 0.3: shrink by one"
    fill(view, "kv_usage", [0.5, 0.5, 0.5])
    assert rule.decide(90.0, view, pool) == {}, "between the thresholds: hold"
    assert rule.decide(90.0, view, {"default": PoolStatus("default", ready=(0, 1, 2, 3, 4))}) == {"default": 4}


def test_pid_autoscaler_follows_its_velocity_form_exactly():
    """Hand-fed signals: x = ln(size) moves by kp (e_k - e_{k-1}) + ki dt e_k + kd (e_k - 2 e_{k-1} + e_{k-2}) / dt
    with e = ln(load per replica / target), clamped; the pool gets round(exp(x)); the integral
    rests while a replica starts."""
    import math

    from llmlb_bench.policies import TargetInfo, View
    from llmlb_bench.sim.autoscale import PidAutoscaler, PoolStatus

    pid = PidAutoscaler(target=10.0, kp=0.5, ki=0.02, kd=2.0, max_replicas=8)
    view = View(targets=[TargetInfo(f"r{i}") for i in range(4)])
    ready = {"default": PoolStatus("default", ready=(0, 1))}
    fill(view, "outstanding_requests", [10, 10, 0, 0])  # 10 per replica: e = 0, the size stays
    assert pid.decide(0.0, view, ready) == {"default": 2}
    fill(view, "outstanding_requests", [20, 20, 0, 0])
    e1, x = math.log(2), math.log(2)
    x += 0.5 * e1 + 0.02 * 10 * e1 + 2.0 * e1 / 10
    assert pid.decide(10.0, view, ready) == {"default": round(math.exp(x))}
    assert pid._state["default"][0] == pytest.approx(x)
    starting = {"default": PoolStatus("default", ready=(0, 1), starting=(2,))}
    e2 = math.log(40 / 3 / 10)                               # the starting replica counts: 40 over 3
    x += 0.5 * (e2 - e1) + 2.0 * (e2 - 2 * e1) / 10          # no integral while r2 starts
    assert pid.decide(20.0, view, starting)["default"] == round(math.exp(x))
    assert pid._state["default"][0] == pytest.approx(x)
    fill(view, "outstanding_requests", [5000, 5000, 0, 0])
    assert pid.decide(30.0, view, ready) == {"default": 8}
    assert pid._state["default"][0] == pytest.approx(math.log(8))    # clamped: no windup above the cap
    fill(view, "outstanding_requests", [0, 0, 0, 0])
    assert pid.decide(40.0, view, ready)["default"] < 8      # so it comes down at once


def test_pid_integral_loop_converges_geometrically_on_a_fixed_load():
    """kp = kd = 0 on a fixed in-flight total N: x_k - x* = (1 - ki dt)^k (x_0 - x*), x* = ln(N / target)."""
    import math

    from llmlb_bench.policies import TargetInfo, View
    from llmlb_bench.sim.autoscale import PidAutoscaler, PoolStatus

    view = View(targets=[TargetInfo(f"r{i}") for i in range(64)])
    put(view, "outstanding_requests", 0, 160)  # N = 160: x* = ln 40
    # the signal sees the rounded size, so the recurrence is x_k = x_{k-1} + ki dt ln(N / (target round(e^x)));
    # it is exact, and the error contracts by (1 - ki dt) = 0.8 per decision up to the rounding
    pid2 = PidAutoscaler(target=4.0, kp=0.0, ki=0.04, max_replicas=64)
    size, x = 1, 0.0
    for k in range(30):
        out = pid2.decide(5.0 * k, view, {"default": PoolStatus("default", ready=tuple(range(size)))})
        if k:
            x += 0.04 * 5.0 * math.log(160 / size / 4.0)
        assert pid2._state["default"][0] == pytest.approx(x)
        if 0 < k < 12:
            assert abs(x - math.log(40)) <= 0.8 ** k * math.log(40) + math.log(1 + 0.5 / size) * 5
        size = out["default"]
    assert size == 40


def test_pid_autoscaler_settles_where_the_load_per_replica_meets_its_target(tmp_path):
    """On the step load (20 req/s of 400 + 100 tokens), the PID autoscaler on in-flight requests
    grows the fleet until each replica holds about its target, then holds it: in the second half
    of the step, the mean in flight per replica (series: waiting + running) is within 30% of the
    target, and the fleet returns to one replica after the step."""
    auto = {"policy": "pid", "interval_s": 5.0, "cold_start_s": 10.0,
            "args": {"metric": "concurrency", "target": 8.0, "kp": 0.5, "ki": 0.05, "max_replicas": 8}}
    req, series, summary = run_sim(tmp_path, _step_load(), ClusterConfig.build(replicas=1, max_num_seqs=16,
                                                                                autoscale=auto))
    t = np.asarray(series.column("t_s").to_pylist())
    load = np.asarray(series.column("waiting").to_pylist()) + np.asarray(series.column("running").to_pylist())
    late = (t >= 120) & (t < 180)
    per_replica = load[late].sum() / len(np.unique(t[late])) / (len(t[late]) / len(np.unique(t[late])))
    assert per_replica == pytest.approx(8.0, rel=0.3)
    size = collections.Counter(t.tolist())
    assert size[30.0] == 1 and max(size.values()) > 1 and size[295.0] == 1
    assert summary["replicas"]["added"] >= 1


def test_pid_autoscaler_settings_are_checked():
    with pytest.raises(UserError, match="metric must be concurrency, queue or kv"):
        ClusterConfig.build(autoscale={"policy": "pid", "args": {"metric": "power"}})
    with pytest.raises(UserError, match="kp, ki, kd >= 0"):
        ClusterConfig.build(autoscale={"policy": "pid", "args": {"ki": -1.0}})
