"""The View a policy is handed is read-only: every way a policy could change it fails, in the
Router and in a real simulation, while the backend's writers update it and every read after a
write sees the new values."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from llmlb_bench.policies import Policy, RouteRequest, Router, TargetInfo, View
from llmlb_bench.policies.base import add_target, fill, on_dispatch, on_finish, put, set_now, view_books
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from tests.sim_helpers import trace

#: what a careless policy might do to the view it was handed, and the error it must get
MUTATIONS: dict[str, Callable[[View], object]] = {
    "item": lambda v: exec("v.outstanding_requests[0] = 99", {"v": v}),
    "augmented item": lambda v: exec("v.waiting[0] += 1", {"v": v}),
    "slice": lambda v: exec("v.healthy[:] = [False] * len(v)", {"v": v}),
    "delete": lambda v: exec("del v.kv_usage[0]", {"v": v}),
    "append": lambda v: v.signal_time.append(0.0),
    "extend": lambda v: v.running.extend([1]),
    "pop": lambda v: v.targets.pop(),
    "sort": lambda v: v.outstanding_tokens.sort(),
    "clear": lambda v: v.adapters.clear(),
    "in-place add": lambda v: exec("v.running += [1]", {"v": v}),
    "attribute": lambda v: setattr(v, "now", 1e9),
    "field replaced": lambda v: setattr(v, "healthy", [False] * len(v)),
    "target facts": lambda v: setattr(v.targets[0], "capacity", 100.0),
}


class _Mutates(Policy):
    name = "mutates"

    def __init__(self, how: Callable[[View], object]) -> None:
        self.how = how

    def choose(self, req: RouteRequest, view: View) -> int:
        self.how(view)
        return 0


FIELDS = ("targets", "now", "outstanding_requests", "outstanding_tokens", "waiting", "running", "kv_usage", "healthy",
          "signal_time", "block_size", "cached_prefix", "adapters")


def _contents(view: View) -> dict[str, object]:
    return {name: getattr(view, name) for name in FIELDS}


def _view() -> View:
    return View([TargetInfo("a"), TargetInfo("b")], waiting=[1, 2])


@pytest.mark.parametrize("how", list(MUTATIONS), ids=list(MUTATIONS))
def test_a_policy_cannot_change_the_view_through_the_router(how: str) -> None:
    view = _view()
    before = _contents(view)
    router: Router[str] = Router(_Mutates(MUTATIONS[how]), view, dispatch=lambda *a: None, reject=lambda *a: None)
    with pytest.raises((TypeError, AttributeError)):
        router.route("x", RouteRequest(0, 0.0, 10, 5), now=1.0)
    assert _contents(view) == {**before, "now": 1.0}           # the router set the time; nothing else moved
    assert view.targets[0].capacity == 1.0


def test_a_mutating_policy_fails_a_simulation(tmp_path) -> None:
    with RunStore(tmp_path, config={}, backend="sim", run_id="r") as run, pytest.raises(TypeError, match="does not support item assignment"):
        simulate(trace(np.array([0.0, 0.5]), 10, 5), ClusterConfig.build(replicas=2), _Mutates(MUTATIONS["item"]), run)


def test_every_read_after_a_backend_write_sees_it() -> None:
    view = _view()
    assert view.waiting is view.waiting                # unchanged: the cached snapshot, no copy per read
    put(view, "waiting", 1, 7)
    fill(view, "kv_usage", [0.5, 0.25])
    set_now(view, 3.0)
    assert (view.waiting, view.kv_usage, view.now) == ((1, 7), (0.5, 0.25), 3.0)
    req = RouteRequest(0, 0.0, 10, 5)
    on_dispatch(view, 1, req)
    assert (view.outstanding_requests, view.outstanding_tokens) == ((0, 1), (0, 15))
    on_finish(view, 1, req)
    assert (view.outstanding_requests, view.outstanding_tokens) == ((0, 0), (0, 0))
    books = view_books(view)                           # a backend's hot loop: plain lists, then changed()
    books.running[0] = 4
    books.changed()
    assert view.running == (4, 0)
    add_target(view, TargetInfo("c"), healthy=False, now=3.0)
    assert (len(view), view.healthy, view.signal_time, view.adapters[2], view.targets[2].name) == (
        3, (True, True, False), (0.0, 0.0, 3.0), None, "c")
    with pytest.raises(ValueError, match="2 values for 3 targets"):
        fill(view, "waiting", [0, 0])
