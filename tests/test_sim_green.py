"""Green controllers (sim/green.py): the slo_slack feedback law, its configuration, and its effect
on a simulated run's clock, energy and latency."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.green import GreenController, GreenSpec, SloSlackController
from sim_helpers import poisson_trace, run_sim


def _fed(ctl: SloSlackController, ttft: float, tpot: float, n: int = 20, t: float = 0.0) -> None:
    for _ in range(n):
        ctl.observe("p", t, ttft, tpot)


def test_slack_lowers_by_one_step_not_below_the_floor():
    ctl = SloSlackController(ttft_s=1.0, tpot_s=0.1, slack=0.8, step=0.05, min_clock=0.5)
    _fed(ctl, 0.2, 0.02)                              # ratio 0.2: slack
    assert ctl.decide(1.0, {"p": 1.0}) == {"p": 0.95}
    assert ctl.decide(1.0, {"p": 0.52}) == {"p": 0.5}
    assert ctl.decide(1.0, {"p": 0.5}) == {}          # at the floor: nothing to change


def test_violation_raises_in_proportion_at_least_one_step_at_most_full():
    ctl = SloSlackController(ttft_s=1.0, tpot_s=0.1, step=0.05, up_gain=0.5)
    _fed(ctl, 1.6, 0.05)                              # ratio 1.6 (TTFT): up by 0.5 x 0.6
    assert ctl.decide(1.0, {"p": 0.5}) == {"p": pytest.approx(0.8)}
    ctl2 = SloSlackController(ttft_s=1.0, tpot_s=0.1, step=0.05, up_gain=0.5)
    _fed(ctl2, 0.5, 0.101)                            # ratio 1.01 (TPOT): at least one step
    assert ctl2.decide(1.0, {"p": 0.5}) == {"p": pytest.approx(0.55)}
    assert ctl.decide(1.0, {"p": 0.9}) == {"p": 1.0}


def test_holds_in_the_band_with_too_few_samples_and_after_the_window():
    ctl = SloSlackController(ttft_s=1.0, tpot_s=0.1, slack=0.8, window_s=10.0, min_samples=10)
    _fed(ctl, 0.9, 0.05)                              # ratio 0.9: between slack and 1
    assert ctl.decide(1.0, {"p": 0.7}) == {}
    few = SloSlackController(min_samples=10)
    _fed(few, 0.01, 0.001, n=9)
    assert few.decide(1.0, {"p": 0.7}) == {}
    old = SloSlackController(window_s=10.0, min_samples=1)
    _fed(old, 0.01, 0.001, n=5, t=0.0)
    assert old.decide(11.0, {"p": 0.7}) == {}         # observations older than the window are gone


def test_percentile_is_a_measured_value():
    ctl = SloSlackController(ttft_s=1.0, tpot_s=0.0, percentile=0.9, min_samples=1)
    for i in range(10):
        ctl.observe("p", 0.0, 0.1 * (i + 1), None)    # TTFTs 0.1 .. 1.0; p90 by nearest rank = 0.9
    assert ctl.ratio("p", 0.0) == pytest.approx(0.9)


@pytest.mark.parametrize("green, message", [
    ({"policy": "nope"}, "unknown green controller"),
    ({"interval_s": 0}, "interval_s"),
    ({"args": {"slack": 1.5}}, "slack"),
    ({"args": {"bogus": 1}}, "bogus"),
    ({"speed": 1}, "speed"),
])
def test_bad_green_settings_are_user_errors(green, message):
    with pytest.raises(UserError, match=message):
        ClusterConfig.build(green=green)


class HalfClock(GreenController):
    """A user controller named as module:Class: half the clock from the first decision on."""

    def decide(self, now: float, clocks: Mapping[str, float]) -> Mapping[str, float]:
        return {pool: 0.5 for pool in clocks}


def test_controller_lowers_clock_and_energy_on_a_light_load_and_keeps_the_slo(tmp_path):
    trace = poisson_trace(600, 2.0, seed=3)
    base = {"replicas": 1, "token_times": "summary"}
    req0, _, s0 = run_sim(tmp_path, trace, ClusterConfig.build(**base), run_id="full")
    green = {"interval_s": 5.0, "args": {"ttft_s": 1.0, "tpot_s": 0.05, "window_s": 10.0, "min_samples": 5}}
    req1, _, s1 = run_sim(tmp_path, trace, ClusterConfig.build(**base, green=green), run_id="green")
    assert s1["green"]["mean_clock"]["default"] < 0.8
    assert s1["green"]["clock_changes"] > 0
    assert s1["energy_j"] < 0.85 * s0["energy_j"]
    # the latency moved (slower steps), but TPOT stays under the controller's own set point at p90
    out = req1.column("output_tokens").to_numpy()
    tpot = (req1.column("last_token_s").to_numpy() - req1.column("first_token_s").to_numpy()) / (out - 1).clip(1)
    assert np.percentile(tpot, 90) < 0.05 * 1.2
    assert req1.column("last_token_s").to_pylist() != req0.column("last_token_s").to_pylist()


def test_user_controller_by_module_path_sets_the_clock(tmp_path):
    trace = poisson_trace(200, 2.0, seed=4)
    cfg = ClusterConfig.build(replicas=1, token_times="summary",
                              green={"policy": "test_sim_green:HalfClock", "interval_s": 1.0})
    _, _, s = run_sim(tmp_path, trace, cfg)
    assert s["green"]["final_clock"] == {"default": 0.5}
    assert s["green"]["clock_changes"] == 1          # the same clock again is no change


def test_spec_defaults_make_the_builtin_controller():
    spec = GreenSpec.parse({})
    assert spec.policy == "slo_slack" and spec.interval_s == 5.0
    assert isinstance(spec.make(), SloSlackController)


def test_controlled_run_is_deterministic(tmp_path):
    trace = poisson_trace(300, 3.0, seed=5)
    green = {"interval_s": 2.0, "args": {"ttft_s": 0.5, "tpot_s": 0.03, "window_s": 5.0, "min_samples": 3}}
    runs = [run_sim(tmp_path, trace, ClusterConfig.build(replicas=2, token_times="summary", green=green),
                    run_id=f"r{i}") for i in range(2)]
    (a, sa_series, sa), (b, sb_series, sb) = runs
    assert a.column("last_token_s").to_pylist() == b.column("last_token_s").to_pylist()
    assert a.column("energy_j").to_pylist() == b.column("energy_j").to_pylist()
    assert sa["green"] == sb["green"] and sa["green"]["clock_changes"] > 0


def test_a_clock_change_reaches_the_pools_replicas_run_cutting_tolerance():
    from llmlb_bench.sim.fleet import Fleet
    from llmlb_bench.sim.replica import STEP_TIME_TOLERANCE

    fleet = Fleet(ClusterConfig.build(replicas=2))
    before = [r._tol_steps for r in fleet.replicas]
    fleet.set_clock("default", 0.25)
    for rep, old in zip(fleet.replicas, before):
        assert rep._tol_steps == STEP_TIME_TOLERANCE * rep.cost.min_step_s / rep.cost.context_slope < old
    with pytest.raises(UserError, match="not a roofline pool"):
        fleet.set_clock("nope", 0.5)


class Recorder(GreenController):
    """Keeps what each pool was fed (a user controller by module path)."""

    seen: dict = {}

    def observe(self, pool, now, ttft_s, tpot_s):
        Recorder.seen.setdefault(pool, []).append((ttft_s, tpot_s))


def test_disaggregated_pools_each_see_their_own_phase(tmp_path):
    Recorder.seen = {}
    cfg = ClusterConfig.build(token_times="summary", pools=[{"name": "prefill", "replicas": 1},
                                                            {"name": "decode", "replicas": 1}],
                              green={"policy": "test_sim_green:Recorder", "interval_s": 1.0})
    run_sim(tmp_path, poisson_trace(60, 2.0, seed=6), cfg, policy="pd_pair")
    prefill, decode = Recorder.seen["prefill"], Recorder.seen["decode"]
    assert len(prefill) == len(decode) == 60
    assert all(tt is not None and tt > 0 and tp is None for tt, tp in prefill)
    assert all(tt is None for tt, _ in decode) and any(tp is not None for _, tp in decode)


def test_ratio_ignores_figures_a_pool_does_not_answer_for():
    ctl = SloSlackController(ttft_s=1.0, tpot_s=0.1, min_samples=1)
    ctl.observe("decode", 0.0, None, 0.05)
    assert ctl.ratio("decode", 0.0) == pytest.approx(0.5)
    ctl.observe("prefill", 0.0, 2.0, None)
    assert ctl.ratio("prefill", 0.0) == pytest.approx(2.0)
