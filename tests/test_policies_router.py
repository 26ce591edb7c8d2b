"""The one Router: decisions, the HOLD queue, REJECT, the bounds check and the view's books,
and the same out-of-range error in all three backends (simulator, llmlb serve, replayer)."""

from __future__ import annotations

import asyncio

import numpy as np
import pyarrow.parquet as pq
import pytest

from llmlb_bench.policies import HOLD, REJECT, Policy, PolicyError, RouteRequest, Router, TargetInfo, View, make_policy
from llmlb_bench.serve.live import LiveFleet, Submission
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from llmlb_bench.policies.base import put
from tests.conftest import make_trace
from tests.replay_helpers import run_replay, servers  # noqa: F401  (fixture)
from tests.sim_helpers import trace


def _req(rid: int, inp: int = 10, out: int = 5) -> RouteRequest:
    return RouteRequest(rid, 0.0, inp, out)


class _Log:
    """A backend's callbacks, recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, int]] = []
        self.rejected: list[tuple[str, str]] = []

    def dispatch(self, item: str, req: RouteRequest, target: int, decode: int) -> None:
        self.sent.append((item, target, decode))

    def reject(self, item: str, req: RouteRequest, why: str) -> None:
        self.rejected.append((item, why))


class _Script(Policy):
    """Answers from a list; holds into a queue it releases to target 1 once nothing is outstanding."""

    name = "script"

    def __init__(self, answers: list) -> None:
        self.answers = answers
        self.queue: list[RouteRequest] = []
        self.completed: list[tuple[int, int]] = []

    def choose(self, req, view):
        d = self.answers.pop(0)
        if d is HOLD:
            self.queue.append(req)
        return d

    def release(self, view):
        if self.queue and sum(view.outstanding_requests) == 0:
            return self.queue.pop(0), 1
        return None

    def on_complete(self, req, target, view):
        self.completed.append((req.request_id, target))


def _router(policy, log: _Log, n: int = 2) -> Router[str]:
    return Router(policy, View([TargetInfo(f"t{i}") for i in range(n)]), dispatch=log.dispatch, reject=log.reject)


def test_route_dispatches_rejects_and_holds_until_release():
    log, pol = _Log(), _Script([0, REJECT, HOLD])
    router = _router(pol, log)
    assert router.route("a", _req(1), 1.0) == 0 and router.view.now == 1.0
    router.sent(0, _req(1))
    assert router.route("b", _req(2), 2.0) is REJECT
    assert router.route("c", _req(3), 3.0) is HOLD
    assert log.sent == [("a", 0, -1)] and log.rejected == [("b", "rejected by the router (script)")]
    assert router.held == {3: "c"}                        # one outstanding: the policy keeps it
    assert router.view.outstanding_requests == (1, 0) and router.view.outstanding_tokens == (15, 0)
    router.complete(0, _req(1))                           # books closed, policy told, queue drained
    assert pol.completed == [(1, 0)] and router.view.outstanding_requests == (0, 0)
    assert log.sent[-1] == ("c", 1, -1) and router.held == {}


def test_a_policy_with_only_choose_gets_the_protocol_defaults():
    class Bare:                               # structural: no base class, no release, no on_complete
        name = "bare"

        def choose(self, req, view):
            return 1

    log = _Log()
    router = _router(Bare(), log)
    router.route("a", _req(1), 0.0)
    router.sent(1, _req(1))
    router.complete(1, _req(1))
    assert log.sent == [("a", 1, -1)] and router.view.outstanding_requests == (0, 0)


@pytest.mark.parametrize("bad", [2, -1, -2, 1.0, None, "0"])
def test_out_of_range_targets_are_one_error(bad):
    log = _Log()
    with pytest.raises(PolicyError, match=r"chose target .*; there are 2 targets \(0\.\.1\)"):
        _router(_Script([bad]), log).route("a", _req(1), 0.0)
    assert log.sent == [] and log.rejected == []


def test_a_refused_release_stays_held_so_the_backend_still_writes_its_row():
    class BadRelease(_Script):
        def release(self, view):
            return (self.queue[0], 5) if self.queue else None

    log = _Log()
    router = _router(BadRelease([HOLD]), log)
    with pytest.raises(PolicyError, match="chose target 5"):
        router.route("a", _req(1), 0.0)
    assert router.take_held() == ["a"] and router.held == {}


def test_pairs_are_checked_and_a_policy_without_choose_pair_is_refused():
    with pytest.raises(PolicyError, match="cannot route a disaggregated cluster"):
        Router(make_policy("round_robin"), View([TargetInfo("p")]), dispatch=_Log().dispatch,
               reject=_Log().reject, disaggregated=True)
    targets = [TargetInfo("p0", pool="prefill"), TargetInfo("d0", pool="decode")]
    log = _Log()
    router = Router(make_policy("pd_pair"), View(targets), dispatch=log.dispatch, reject=log.reject,
                    disaggregated=True)
    router.route_pair("a", _req(1), 0.0)
    assert log.sent == [("a", 0, 1)]
    put(router.view, "healthy", 1, False)
    assert router.route_pair("b", _req(2), 0.0) is REJECT
    assert log.rejected == [("b", "no healthy prefill or decode target")]


class _Always(Policy):
    name = "always"

    def __init__(self, target: int) -> None:
        self.target = target

    def choose(self, req, view):
        return self.target


def test_out_of_range_in_the_simulator(tmp_path):
    with pytest.raises(PolicyError, match="--policy: policy 'always' chose target -1; there are 2 targets"):
        with RunStore(tmp_path, config={}, backend="sim", run_id="bad") as run:
            simulate(trace(np.array([0.0, 0.1]), 10, 10), ClusterConfig.build(replicas=2), _Always(-1), run)


def test_out_of_range_in_llmlb_serve():
    async def go():
        fleet = LiveFleet(ClusterConfig.build(replicas=2), policy=_Always(-1))
        with pytest.raises(PolicyError, match="chose target -1"):
            fleet.submit(Submission(10, 5, (), stream=False), client=None)  # type: ignore[arg-type]
        assert fleet.view.outstanding_requests == (0, 0)
        fleet.close()
    asyncio.run(go())


def test_out_of_range_in_the_replayer_stops_the_run_and_writes_every_row(servers, tmp_path):  # noqa: F811
    url, cfg = servers.noop()
    with pytest.raises(PolicyError, match="chose target -1"):
        run_replay(make_trace(n=5, rate=50.0), [url], tmp_path, _Always(-1), run_id="bad")
    rows = sorted(pq.read_table(tmp_path / "bad" / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
    assert len(rows) == 5 and not cfg.records                    # nothing reached the endpoint
    assert rows[0]["status"] == "error" and "chose target -1" in rows[0]["error"]
    assert {r["status"] for r in rows[1:]} == {"not_sent"}


def test_a_bad_release_in_the_replayer_stops_the_run_from_its_callback(servers, tmp_path):  # noqa: F811
    class ReleaseToNine(_Script):
        def choose(self, req, view):
            if req.request_id == 0:
                return 0
            self.queue.append(req)
            return HOLD

        def release(self, view):
            return (self.queue[0], 9) if self.queue and sum(view.outstanding_requests) == 0 else None

    url, _ = servers.noop()
    with pytest.raises(PolicyError, match="chose target 9"):
        run_replay(make_trace(n=3, rate=100.0, output_tokens=4), [url], tmp_path, ReleaseToNine([]), run_id="bad")
    rows = sorted(pq.read_table(tmp_path / "bad" / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
    assert [r["status"] for r in rows] == ["ok", "not_sent", "not_sent"]   # one row each, the held ones unsent


def test_a_sink_subclass_is_told_what_the_router_decides_and_the_router_takes_one_way_only():
    """The Router tells its backend through a ``Sink`` (what the trace-run core is, so the compiled
    Router calls it natively); a backend written in Python subclasses it the same way, and the two
    callables are the other way in, never both and never neither."""
    from llmlb_bench.policies.router import Sink

    class Told(Sink[str]):
        def __init__(self) -> None:
            self.seen: list[tuple[str, object]] = []

        def dispatch(self, item, req, target, decode_target):
            self.seen.append(("dispatch", (item, req.request_id, target, decode_target)))

        def reject(self, item, req, why):
            self.seen.append(("reject", (item, req.request_id, why)))

    told = Told()
    view = View([TargetInfo("a"), TargetInfo("b")])
    router: Router[str] = Router(_Script([1, REJECT]), view, sink=told)
    router.route("x", _req(0), 0.0)
    router.route("y", _req(1), 0.0)
    assert told.seen == [("dispatch", ("x", 0, 1, -1)), ("reject", ("y", 1, "rejected by the router (script)"))]
    with pytest.raises(TypeError, match="needs a sink"):
        Router(make_policy("round_robin"), view, dispatch=print)
    with pytest.raises(TypeError, match="not both"):
        Router(make_policy("round_robin"), view, dispatch=print, reject=print, sink=told)
