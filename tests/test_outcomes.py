"""Outcomes reach policies: every backend sets ``RouteRequest.outcome`` before ``on_complete`` for a
policy that observes, with the same clock as ``arrival_s``, and the figures match the results rows."""

from __future__ import annotations

from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmlb_bench.policies import HOLD, REJECT, Outcome, Policy, RouteRequest, Router, View, make_policy
from llmlb_bench.policies.router import HELD_AT_END
from llmlb_bench.replay.options import ReplayOptions
from llmlb_bench.schema import TRACE
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from llmlb_bench.replay import runner
from llmlb_bench.trace_run import NOT_RELEASED, Backend
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


class HoldOddRejectSome(Policy):
    """Holds the odd request ids for good, rejects request 2 and sends the rest to target 0."""

    name = "hold_odd_reject_some"

    def choose(self, req: RouteRequest, view: View):
        return HOLD if req.request_id % 2 else REJECT if req.request_id == 2 else 0


def _noting_ends(seen: dict[int, float]):
    """A stand-in for the replayer's ``TraceRun`` that notes, per row, the time the replayer ended it
    (``seen``): an answered row's through ``ended``, a refused one's through the clock read right after
    its row was written (``TraceRun.reject``). WHY not a patch of ``TraceSchedule.ended``: compiled
    (compiled_core.py), TraceRun calls it natively and a patch of the class is never seen; the backend's
    methods (the replayer's, interpreted) and the calls made from the replayer's own code always are."""
    real = runner.TraceRun

    class NotingBackend(Backend):
        """The replayer as the run's backend, noting refused rows' ends on the clock read after them."""

        def __init__(self, backend: Backend) -> None:
            self.backend = backend
            self.refused: list[int] = []

        def launch(self, row, route, target, decode_target):
            return self.backend.launch(row, route, target, decode_target)

        def write(self, row, target, status, error):
            if status == "rejected":
                self.refused.append(row)
            return self.backend.write(row, target, status, error)

        def arrive_at(self, row, due):
            return self.backend.arrive_at(row, due)

        def clock(self) -> float:
            t = self.backend.clock()
            while self.refused:
                seen[self.refused.pop()] = t
            return t

    class Noting:
        def __init__(self, policy, view, tr, schedule, backend, **kwargs) -> None:
            self._core = real(policy, view, tr, schedule, NotingBackend(backend), **kwargs)

        def ended(self, row, target, route, t, drain=True):
            seen[row] = t
            return self._core.ended(row, target, route, t, drain)

        def __getattr__(self, name):
            return getattr(self._core, name)
    return Noting


def _both_backends(tmp_path, noop_url: str, tr, policy, users: int | None = None,
                   ends: dict[int, float] | None = None) -> tuple[dict, dict]:
    """The trace through the simulator and the replayer (against the no-op server) under fresh copies
    of ``policy``; the rows of each by request id. ``ends`` gets, per row of the trace, when the
    replayer took it as ended (the time its dependents are released from: the end of a response as
    the client read it, a refusal, a drop), which its rows do not hold."""
    with RunStore(tmp_path, config={}, backend="sim", run_id="sim") as run:
        simulate(tr, ClusterConfig.build(replicas=1), policy(), run, users=users, think_s=0.01)
    seen = {} if ends is None else ends
    with mock.patch.object(runner, "TraceRun", _noting_ends(seen)):
        run_replay(tr, [noop_url], tmp_path, policy(), ReplayOptions(users=users, think_s=0.01), run_id="replay")
    sim, rep = _rows(tmp_path / "sim"), _rows(tmp_path / "replay")
    assert set(sim) == set(rep) and len(sim) == tr.num_rows           # every trace row has one row in each
    for rid in sim:
        assert (sim[rid]["status"], sim[rid]["error"]) == (rep[rid]["status"], rep[rid]["error"]), rid
    return sim, rep


def _family_trace():
    """12 requests; rows 6..11 depend on rows 0..5 (row 6 + k on row k, due as early as it), 50 ms after it ends."""
    tr = make_trace(n=12, rate=50.0, output_tokens=3)
    arrival = pa.array([k / 50.0 for k in range(6)] * 2, pa.float64())
    tr = tr.set_column(tr.schema.get_field_index("arrival_s"), "arrival_s", arrival)
    parent = pa.array([None] * 6 + list(range(6)), pa.int64())
    after = pa.array([None] * 6 + [0.05] * 6, pa.float64())
    tr = tr.set_column(tr.schema.get_field_index("parent_id"), "parent_id", parent)
    return TRACE.conform(tr.set_column(tr.schema.get_field_index("after_parent_s"), "after_parent_s", after), "test")


def test_requests_held_at_the_end_get_one_status_in_both_backends(servers, tmp_path):  # noqa: F811
    """The same trace through the same holding policy: simulated and replayed rows agree status by status
    (they once differed: not_sent in the simulator, rejected in the replayer)."""
    sim, _ = _both_backends(tmp_path, servers.noop()[0], make_trace(n=8, rate=50.0, output_tokens=3), HoldTheOdd)
    for rid in sim:
        assert sim[rid]["status"] == ("not_sent" if rid % 2 else "ok")
    assert sim[1]["error"] == HELD_AT_END[1]


def test_dependents_of_held_and_rejected_requests_agree_in_both_backends(servers, tmp_path):  # noqa: F811
    """Dependents of a request the policy holds to the end are never sent (both backends write them
    ``not_sent``: the simulator once left them out, the replayer waited for them for ever); dependents of
    a rejected request are released by its end and routed like any other (trace_run.py)."""
    ends: dict[int, float] = {}
    sim, rep = _both_backends(tmp_path, servers.noop()[0], _family_trace(), HoldOddRejectSome, ends=ends)
    expect = {0: "ok", 1: "not_sent", 2: "rejected", 3: "not_sent", 4: "ok", 5: "not_sent",
              6: "ok", 7: "not_sent", 8: "ok", 9: "not_sent", 10: "ok", 11: "not_sent"}
    assert {rid: r["status"] for rid, r in sim.items()} == expect
    assert {sim[rid]["error"] for rid in (1, 3, 5)} == {HELD_AT_END[1]}
    assert {sim[rid]["error"] for rid in (7, 9, 11)} == {NOT_RELEASED[1]}
    # sent after_parent_s after their parent ended, in both backends (the replayer's end: when it read the
    # response's end, after its last token; how long after is this machine's, so it is read, not bounded)
    for rid in (6, 10):
        assert sim[rid]["scheduled_s"] == pytest.approx(sim[rid - 6]["last_token_s"] + 0.05, abs=1e-9)
        assert rep[rid]["scheduled_s"] == pytest.approx(ends[rid - 6] + 0.05, abs=1e-9)
        assert ends[rid - 6] >= rep[rid - 6]["last_token_s"]
    # the rejected request's dependent: released by its refusal (at its arrival, 40 ms), 50 ms later
    assert sim[8]["scheduled_s"] == pytest.approx(0.09, abs=1e-9)
    assert rep[8]["scheduled_s"] == pytest.approx(ends[2] + 0.05, abs=1e-9) and ends[2] >= rep[2]["scheduled_s"]


def test_closed_loop_users_agree_in_both_backends(servers, tmp_path):  # noqa: F811
    """Closed loop (``--users``) in both backends: a user whose request the policy holds never returns, so
    the rows it would have sent stay ``not_sent``; the others go on through rejections."""
    sim, _ = _both_backends(tmp_path, servers.noop()[0], make_trace(n=10, rate=50.0, output_tokens=3),
                            HoldOddRejectSome, users=2)
    # user A sends row 0 (ok), then row 2 (rejected), then row 3, held for good; user B row 1, held for
    # good: no user is left to send rows 4..9
    assert [sim[rid]["status"] for rid in range(4)] == ["ok", "not_sent", "rejected", "not_sent"]
    assert {sim[rid]["error"] for rid in (1, 3)} == {HELD_AT_END[1]}
    assert {(sim[rid]["status"], sim[rid]["error"]) for rid in range(4, 10)} == {NOT_RELEASED}


class DropAfterFirst(Policy):
    """Holds request 1 until request 0 has ended, then drops it from the queue (REJECT on release)."""

    name = "drop_after_first"

    def __init__(self) -> None:
        self.held: RouteRequest | None = None
        self.first_done = False

    def choose(self, req: RouteRequest, view: View):
        if req.request_id == 1:
            self.held = req
            return HOLD
        return 0

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        self.first_done = self.first_done or req.request_id == 0

    def release(self, view: View):
        if self.held is not None and self.first_done:
            req, self.held = self.held, None
            return req, REJECT
        return None


def test_a_request_dropped_from_the_queue_releases_its_dependents_at_the_drop(servers, tmp_path):  # noqa: F811
    """Row 2 waits for row 1, which the policy holds until row 0 ends and then drops: row 2 reaches the
    router when row 1 was dropped (in the simulator at row 0's end), in both backends; the simulator once
    released it at the last routing decision's time, before the event that dropped row 1."""
    tr = make_trace(n=3, rate=100.0, output_tokens=40)
    parent = pa.array([None, None, 1], pa.int64())
    after = pa.array([None, None, 0.0], pa.float64())
    tr = tr.set_column(tr.schema.get_field_index("parent_id"), "parent_id", parent)
    tr = TRACE.conform(tr.set_column(tr.schema.get_field_index("after_parent_s"), "after_parent_s", after), "test")
    ends: dict[int, float] = {}
    sim, rep = _both_backends(tmp_path, servers.noop()[0], tr, DropAfterFirst, ends=ends)
    assert [sim[rid]["status"] for rid in range(3)] == ["ok", "rejected", "ok"]
    assert sim[1]["error"] == "dropped by the router queue"
    assert sim[2]["scheduled_s"] == sim[0]["last_token_s"]
    # in the replay: row 1 was dropped once it had arrived and row 0 had ended as the replayer read it
    # (against the no-op server, row 0 may end before row 1 arrives), and row 2 was released by the drop,
    # due then or at its own arrival (0.02 s), whichever is later
    assert ends[1] >= max(ends[0], rep[1]["scheduled_s"]) and ends[0] >= rep[0]["last_token_s"]
    assert rep[2]["scheduled_s"] == max(ends[1], 0.02)
