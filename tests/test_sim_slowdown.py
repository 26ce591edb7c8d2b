"""A scheduled slowdown of one replica (cluster ``slowdowns``): its steps take ``factor`` times as
long from ``at_s`` (for ``for_s``), the others are untouched, and bad entries are one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.sim import ClusterConfig
from sim_helpers import run_sim, trace


def _times(req):
    r = req.to_pylist()
    return {x["request_id"]: (x["first_token_s"] - x["sent_s"], x["last_token_s"] - x["sent_s"], x["target"]) for x in r}


def test_a_slowed_replica_takes_factor_times_as_long_per_request(tmp_path):
    """Requests alone on the replica, one every 10 s: from the slowdown on (and until it ends)
    TTFT and E2E are exactly ``factor`` times those of the same request before it."""
    table = trace(np.arange(1.0, 60.0, 10.0), 500, 50)
    base = _times(run_sim(tmp_path, table, ClusterConfig.build(replicas=1), run_id="base")[0])
    slow = _times(run_sim(tmp_path, table, ClusterConfig.build(replicas=1, slowdowns=[
        {"target": "r0", "at_s": 15.0, "factor": 2.5, "for_s": 30.0}]), run_id="slow")[0])
    for rid, (ttft, e2e, _) in base.items():
        factor = 2.5 if 15.0 <= 1.0 + 10 * rid < 45.0 else 1.0
        assert slow[rid][0] == pytest.approx(factor * ttft, rel=1e-9)
        assert slow[rid][1] == pytest.approx(factor * e2e, rel=1e-9)


def test_a_decode_run_in_flight_slows_at_its_next_step(tmp_path):
    """A long decode that the slowdown meets halfway: its E2E lies strictly between the fast and
    the slow one, as (fast part) + factor x (the rest)."""
    table = trace(np.array([0.0]), 100, 2000)
    fast = _times(run_sim(tmp_path, table, ClusterConfig.build(replicas=1), run_id="f")[0])[0][1]
    cut = fast / 2
    mixed = _times(run_sim(tmp_path, table, ClusterConfig.build(replicas=1, slowdowns=[
        {"target": "r0", "at_s": cut, "factor": 3.0}]), run_id="m")[0])[0][1]
    assert mixed == pytest.approx(cut + 3.0 * (fast - cut), rel=0.01)


def test_other_replicas_are_untouched(tmp_path):
    table = trace(np.arange(0.0, 40.0, 2.0), 300, 50)
    cfg = dict(replicas=2)
    base = _times(run_sim(tmp_path, table, ClusterConfig.build(**cfg), "round_robin", run_id="b")[0])
    slow = _times(run_sim(tmp_path, table, ClusterConfig.build(**cfg, slowdowns=[
        {"target": "r1", "at_s": 0.5, "factor": 2.0}]), "round_robin", run_id="s")[0])
    for rid, (_ttft, e2e, target) in base.items():
        assert slow[rid][2] == target
        assert slow[rid][1] == pytest.approx(e2e * (2.0 if target == "r1" else 1.0), rel=1e-9)


@pytest.mark.parametrize("entry,problem", [
    ({"target": "r9", "at_s": 1, "factor": 2}, "unknown target 'r9'"),
    ({"target": "r0", "at_s": 1}, "needs target, at_s and factor"),
    ({"target": "r0", "at_s": 1, "factor": 0}, "factor > 0"),
    ({"target": "r0", "at_s": 1, "factor": "x"}, "must be numbers"),
])
def test_bad_slowdowns_are_one_line_errors(entry, problem):
    with pytest.raises(UserError, match=problem):
        ClusterConfig.build(replicas=2, slowdowns=[entry])


def test_a_slowdown_round_trips_through_run_json():
    cfg = ClusterConfig.build(replicas=2, slowdowns=[{"target": "r1", "at_s": 5, "factor": 2.0}])
    assert ClusterConfig.from_dict(cfg.to_dict()) == cfg
