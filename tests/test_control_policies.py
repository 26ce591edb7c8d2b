"""The control family against theory: step responses in the simulator on a queue whose dynamics are known.

The plant: one replica serving one request at a time (``max_num_seqs = 1``), every request of the
same length, so each takes the same S seconds and its first token comes p after it starts. When
the router holds a backlog and admits up to n requests, a newly admitted request waits for the
n - 1 ahead of it: its TTFT from dispatch is exactly y(n) = (n - 1) S + p (a fluid queue with a
deterministic server: no randomness left to average). With the controller's limit L, n = ceil(L).
The PI loop on that plant is then the map

    e_k = (r - y(ceil(L_{k-1}))) / r,   L_k = L_{k-1} + kp (e_k - e_{k-1}) + ki T e_k

which the tests iterate and set beside the simulated controller's history: a load step from half
to twice the server's rate is answered as the gains predict (for kp = 0, geometric at rate
1 - ki T S / r). Tolerance: 1e-6 requests of limit (float rounding only; every quantity is exact).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.policies import make_policy
from llmlb_bench.policies.control import ConcurrencyLimit, PiAdmission
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from llmlb_bench.policies.base import fill
from tests.sim_helpers import trace

CFG = dict(replicas=1, max_num_seqs=1)
PROMPT, OUTPUT = 100, 20
STEP_S = 30.0


def _run(tmp_path, table, policy, run_id="run", **cluster):
    cfg = ClusterConfig.build(**{**CFG, **cluster})
    with RunStore(tmp_path, config={}, backend="sim", run_id=run_id) as run:
        simulate(table, cfg, policy, run)
    return pq.read_table(run.dir / "requests.parquet")


@pytest.fixture(scope="module")
def plant(tmp_path_factory):
    """(p, S): first token and service time of one request alone on the replica."""
    rows = _run(tmp_path_factory.mktemp("plant"), trace(np.array([0.0]), PROMPT, OUTPUT),
                make_policy("round_robin")).to_pylist()
    return rows[0]["first_token_s"], rows[0]["last_token_s"]


def _step_trace(S: float, end_s: float):
    """Evenly spaced arrivals at half the server's rate until STEP_S, then at twice it until end_s."""
    mu = 1.0 / S
    low = np.arange(int(STEP_S * 0.5 * mu)) / (0.5 * mu)
    high = STEP_S + np.arange(int((end_s - STEP_S) * 2 * mu)) / (2 * mu)
    return trace(np.concatenate([low, high]), PROMPT, OUTPUT)


def _predicted(L: float, e_prev: float, steps: int, r: float, p: float, S: float, kp: float, ki: float,
               T: float) -> list[float]:
    out = []
    for _ in range(steps):
        e = (r - ((math.ceil(L - 1e-9) - 1) * S + p)) / r
        L = max(1.0, L + kp * (e - e_prev) + ki * T * e)
        e_prev = e
        out.append(L)
    return out


@pytest.mark.parametrize("rate,kp", [(0.5, 0.0), (0.8, 0.0), (0.5, 1.0)])
def test_pi_admission_step_response_follows_its_gains(tmp_path, plant, rate, kp):
    """After the load step the limit moves exactly as the PI map on y(n) = (n - 1) S + p predicts,
    and settles where y meets the target within one service time (the limit's quantum)."""
    p, S = plant
    r, T = 2.0, 5.0
    ki = (1 - rate) * r / (T * S)          # kp = 0: the error shrinks by (1 - ki T S / r) = rate per period
    pol = PiAdmission(target_ttft_s=r, kp=kp, ki=ki, period_s=T, window_s=2.0, quantile=0.9)
    rows = _run(tmp_path, _step_trace(S, 150.0), pol)
    hist = pol.history
    k0 = next(k for k, (t, _, _) in enumerate(hist) if t >= STEP_S)
    t_step, y_step, L_step = hist[k0]
    assert t_step == STEP_S and y_step == pytest.approx(p, abs=1e-9)     # underloaded: no queue, y = p
    assert L_step == 2.0                   # not binding: the limit fell to headroom x the peak in flight (1)
    predicted = _predicted(L_step, (r - y_step) / r, 12, r, p, S, kp, ki, T)
    simulated = [L for _, _, L in hist[k0 + 1:k0 + 13]]
    assert simulated == pytest.approx(predicted, abs=1e-6)
    L_final = hist[-1][2]
    n_star = (r - p) / S + 1               # the concurrency at which y(n) = r
    assert math.ceil(L_final - 1e-9) == math.floor(n_star)
    y_final = [y for t, y, _ in hist if y is not None and 100 <= t <= 150]
    assert max(y_final) <= r and min(y_final) >= r - S
    assert {x["status"] for x in rows.to_pylist()} == {"ok"}  # max_queue is large: nothing shed


def test_pi_admission_sheds_past_its_queue_bound(tmp_path, plant):
    p, S = plant
    pol = PiAdmission(target_ttft_s=2.0, kp=0.0, ki=1.0, period_s=5.0, window_s=2.0, max_queue=10)
    rows = _run(tmp_path, _step_trace(S, 90.0), pol).to_pylist()
    status = [x["status"] for x in rows]
    assert status.count("rejected") > 0 and status.count("ok") > 0
    assert all(x["status"] == "ok" for x in rows if x["scheduled_s"] < STEP_S)


def test_pi_admission_drops_requests_that_waited_too_long(tmp_path, plant):
    p, S = plant
    pol = PiAdmission(target_ttft_s=2.0, kp=0.0, ki=1.0, period_s=5.0, window_s=2.0, max_wait_s=3.0)
    rows = _run(tmp_path, _step_trace(S, 90.0), pol).to_pylist()
    ok = [x for x in rows if x["status"] == "ok"]
    assert any(x["status"] == "rejected" for x in rows)
    assert max(x["sent_s"] - x["scheduled_s"] for x in ok) <= 3.0 + 1e-9


def test_aimd_limit_saw_tooths_below_the_congestion_point(tmp_path, plant):
    """AIMD on the same plant: +1 per congestion-free period, x0.9 (at least -1) on congestion; in
    steady state the limit climbs to the concurrency whose TTFT first passes the target and backs
    off from there. The requests in flight at a decrease were admitted under the old limit, so the
    period after it sees congestion too and backs off once more: the limit stays in
    [n_max - 2, n_max + 1] (decreases of 1 at this size), n_max the largest n whose y(n) <= r."""
    p, S = plant
    r = 2.0
    pol = ConcurrencyLimit(algorithm="aimd", target_ttft_s=r, period_s=5.0, initial_limit=2.0)
    _run(tmp_path, _step_trace(S, 200.0), pol)
    n_max = math.floor((r - p) / S + 1)
    late = [L for t, _, L in pol.history if t >= 120]
    assert late and min(late) >= n_max - 2 - 1e-9 and max(late) <= n_max + 1 + 1e-9
    assert max(late) > n_max            # it probes past the point ...
    assert min(late) < n_max + 1        # ... and backs off


def test_gradient2_limit_holds_the_queue_near_its_allowance(tmp_path, plant):
    """Gradient2 settles where gradient x L + queue_size = L, i.e. the limit exceeds what the
    no-load TTFT supports by about queue_size / (1 - gradient); on this plant the limit stays
    bounded under a sustained overload (the open-loop alternative grows without bound)."""
    p, S = plant
    pol = ConcurrencyLimit(algorithm="gradient2", period_s=5.0, initial_limit=2.0, queue_size=2.0, tolerance=1.0)
    _run(tmp_path, _step_trace(S, 200.0), pol)
    late = [L for t, _, L in pol.history if t >= 120]
    assert late and max(late) < 20 and min(late) >= 2


def test_concurrency_limit_routes_around_targets_at_their_limit():
    from llmlb_bench.policies import HOLD, RouteRequest, TargetInfo, View

    pol = ConcurrencyLimit(initial_limit=2.0)
    view = View([TargetInfo("a"), TargetInfo("b")])
    req = lambda i: RouteRequest(i, 0.0, 10, 10)  # noqa: E731
    fill(view, "outstanding_requests", [2, 1])
    assert pol.choose(req(0), view) == 1
    fill(view, "outstanding_requests", [2, 2])
    assert pol.choose(req(1), view) is HOLD
    assert pol.held == 1


def test_controllers_are_deterministic(tmp_path, plant):
    p, S = plant
    tables = []
    for k in range(2):
        pol = make_policy("pi_admission", {"target_ttft_s": 1.0, "inner": "power_of_d", "inner_args": "d=2"}, seed=3)
        tables.append(_run(tmp_path, _step_trace(S, 60.0), pol, run_id=f"r{k}", replicas=2))
    assert tables[0].drop(["run_id"]).equals(tables[1].drop(["run_id"]))


@pytest.mark.parametrize("args,problem", [
    ({"inner": "nope"}, "unknown policy 'nope'"),
    ({"inner": "pi_admission"}, "is itself a controller"),
    ({"inner_args": "d=2"}, "has no parameter 'd'"),
    ({"kp": -1.0}, "kp, ki >= 0"),
    ({"period_s": 0.0}, "period_s > 0"),
])
def test_bad_controller_parameters_are_one_line_errors(args, problem):
    with pytest.raises(UserError, match=problem):
        make_policy("pi_admission", args)


def test_an_inner_policy_that_rejects_is_a_one_line_error(tmp_path, plant):
    pol = PiAdmission(inner="admission_control", inner_args="max_outstanding=1", initial_limit=8.0)
    with pytest.raises(UserError, match="must pick a target, not reject"):
        _run(tmp_path, trace(np.zeros(4), PROMPT, OUTPUT), pol)


def test_bad_concurrency_limit_algorithm():
    with pytest.raises(UserError, match="aimd or gradient2"):
        make_policy("concurrency_limit", {"algorithm": "vegas"})
