"""Outcomes reach policies: every backend sets ``RouteRequest.outcome`` before ``on_complete`` for a
policy that observes, with the same clock as ``arrival_s``, and the figures match the results rows."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from llmlb_bench.policies import HOLD, Outcome, Policy, RouteRequest, Router, View, make_policy
from llmlb_bench.policies.router import HELD_AT_END
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from tests.conftest import make_trace
from tests.replay_helpers import run_replay, servers  # noqa: F401  (fixture)
from tests.serve_helpers import route_over_serve
from tests.sim_helpers import poisson_trace


class Observer(Policy):
    """Round robin that keeps every outcome it is told of."""

    name = "observer"

    def __init__(self) -> None:
        self.n = 0
        self.seen: dict[int, tuple[RouteRequest, Outcome]] = {}

    def choose(self, req: RouteRequest, view: View) -> int:
        self.n += 1
        return self.n % len(view)

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        assert req.outcome is not None and req.request_id not in self.seen
        self.seen[req.request_id] = (req, req.outcome)


class Blind(Policy):
    """The same decisions without an ``on_complete`` of its own."""

    name = "blind"

    def __init__(self) -> None:
        self.n = 0

    def choose(self, req: RouteRequest, view: View) -> int:
        self.n += 1
        return self.n % len(view)


def _rows(folder) -> dict[int, dict]:
    return {r["request_id"]: r for r in pq.read_table(folder / "requests.parquet").to_pylist()}


def test_only_policies_with_their_own_on_complete_observe():
    view = View([])
    assert Router(Observer(), view, dispatch=print, reject=print).observes
    assert not Router(Blind(), view, dispatch=print, reject=print).observes
    assert not Router(make_policy("round_robin"), view, dispatch=print, reject=print).observes


@pytest.mark.parametrize("cluster", [dict(replicas=2), dict(replicas=2, enable_prefix_caching=True)])
def test_simulator_outcomes_are_the_rows_figures(tmp_path, cluster):
    tr = poisson_trace(300, rate=40.0, seed=3)
    policy = Observer()
    with RunStore(tmp_path, config={}, backend="sim", run_id="obs") as run:
        simulate(tr, ClusterConfig.build(**cluster), policy, run)
    with RunStore(tmp_path, config={}, backend="sim", run_id="blind") as run:
        simulate(tr, ClusterConfig.build(**cluster), Blind(), run)
    rows, blind = _rows(tmp_path / "obs"), _rows(tmp_path / "blind")
    assert set(policy.seen) == set(rows) and len(rows) == 300
    for rid, (req, out) in policy.seen.items():
        row = rows[rid]
        assert out.status == row["status"] == "ok"
        # exact: the same first-token time the results row computes in bulk, on the same clock
        assert out.first_token_s == row["first_token_s"] and out.end_s == row["last_token_s"]
        assert out.first_token_s - req.arrival_s == row["first_token_s"] - row["scheduled_s"]
        assert out.output_tokens == row["output_tokens"]
    # observing costs nothing in behaviour: the same decisions give byte-identical rows
    for rid, row in rows.items():
        assert {k: v for k, v in row.items() if k != "run_id"} == {k: v for k, v in blind[rid].items()
                                                                     if k != "run_id"}


def test_simulator_outcome_of_a_request_the_target_refuses(tmp_path):
    tr = make_trace(n=3, rate=10.0, input_tokens=9000, output_tokens=10)    # beyond 8,192 tokens
    policy = Observer()
    with RunStore(tmp_path, config={}, backend="sim", run_id="r") as run:
        simulate(tr, ClusterConfig.build(replicas=2), policy, run)
    assert {o.status for _, o in policy.seen.values()} == {"rejected"}
    assert all(o.first_token_s is None and o.output_tokens == 0 for _, o in policy.seen.values())


def _check_real_clock(policy: Observer, rows: dict[int, dict], n: int) -> None:
    assert len(policy.seen) == n
    for rid, (req, out) in policy.seen.items():
        row = rows[rid]
        assert out.status == "ok" and out.output_tokens == row["output_tokens"] > 0
        assert out.first_token_s is not None and req.arrival_s <= out.first_token_s <= out.end_s


def test_replayer_outcomes_on_the_run_clock(servers, tmp_path):  # noqa: F811
    urls = [servers.noop()[0], servers.noop()[0]]
    policy = Observer()
    run_replay(make_trace(n=20, rate=100.0, output_tokens=5), urls, tmp_path, policy, run_id="r")
    rows = _rows(tmp_path / "r")
    _check_real_clock(policy, rows, 20)
    for rid, (req, out) in policy.seen.items():   # the row's TTFT, from the same measurements
        assert out.first_token_s is not None
        assert out.first_token_s - req.arrival_s == pytest.approx(rows[rid]["first_token_s"] - rows[rid]["scheduled_s"],
                                                                  abs=1e-6)


def test_llmlb_serve_and_route_outcomes(tmp_path):
    """``llmlb serve``'s own router, and ``llmlb route`` in front of it, both tell an observing policy."""
    inner, outer = Observer(), Observer()
    route_over_serve(tmp_path, inner, outer)
    _check_real_clock(outer, _rows(tmp_path / "r"), 6)
    assert {o.output_tokens for _, o in outer.seen.values()} == {4}
    assert len(inner.seen) == 6 and {o.output_tokens for _, o in inner.seen.values()} == {4}
    assert all(o.status == "ok" and o.first_token_s is not None for _, o in inner.seen.values())


class HoldTheOdd(Policy):
    """Sends even request ids to target 0 and holds the odd ones for good (releases nothing)."""

    name = "hold_the_odd"

    def choose(self, req: RouteRequest, view: View):
        return HOLD if req.request_id % 2 else 0


def test_requests_held_at_the_end_get_one_status_in_both_backends(servers, tmp_path):  # noqa: F811
    """The same trace through the same holding policy: simulated and replayed rows agree status by status
    (they once differed: not_sent in the simulator, rejected in the replayer)."""
    tr = make_trace(n=8, rate=50.0, output_tokens=3)
    with RunStore(tmp_path, config={}, backend="sim", run_id="sim") as run:
        simulate(tr, ClusterConfig.build(replicas=1), HoldTheOdd(), run)
    run_replay(tr, [servers.noop()[0]], tmp_path, HoldTheOdd(), run_id="replay")
    sim, rep = _rows(tmp_path / "sim"), _rows(tmp_path / "replay")
    assert set(sim) == set(rep) and len(sim) == 8
    for rid in sim:
        assert (sim[rid]["status"], sim[rid]["error"]) == (rep[rid]["status"], rep[rid]["error"])
        assert sim[rid]["status"] == ("not_sent" if rid % 2 else "ok")
    assert sim[1]["error"] == HELD_AT_END[1]
