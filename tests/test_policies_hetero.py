"""Capacity-weighted routing over mixed pools and prefill/decode pairing."""

from __future__ import annotations

from collections import Counter

from llmlb_bench.policies import REJECT, RouteRequest, TargetInfo, View, make_policy
from llmlb_bench.policies.base import on_dispatch


def req(i: int = 0) -> RouteRequest:
    return RouteRequest(i, 0.0, 100, 50)


def test_weighted_round_robin_is_smooth_and_proportional_to_capacity():
    v = View([TargetInfo("a", capacity=5), TargetInfo("b", capacity=1), TargetInfo("c", capacity=1)])
    pol = make_policy("capacity_weighted", {"load": "none"})
    seq = [pol.choose(req(), v) for _ in range(7)]
    assert seq == [0, 0, 1, 0, 2, 0, 0]  # nginx's documented order for weights 5, 1, 1
    counts = Counter(pol.choose(req(), v) for _ in range(700))
    assert [counts[i] for i in range(3)] == [500, 100, 100]


def test_capacity_weighted_jsq_fills_fast_targets_in_proportion():
    v = View([TargetInfo("h100", capacity=2.0), TargetInfo("a100", capacity=1.0)])
    pol = make_policy("capacity_weighted")
    for i in range(30):
        t = pol.choose(req(i), v)
        on_dispatch(v, t, req(i))
    assert v.outstanding_requests == (20, 10)


def test_capacity_weighted_skips_unhealthy_targets():
    v = View([TargetInfo("a", capacity=9), TargetInfo("b")], healthy=[False, True])
    assert {make_policy("capacity_weighted").choose(req(), v) for _ in range(5)} == {1}
    assert {make_policy("capacity_weighted", {"load": "none"}).choose(req(), v) for _ in range(5)} == {1}


def test_pd_pair_picks_the_shortest_queue_in_each_pool():
    targets = [TargetInfo("p0", pool="prefill"), TargetInfo("p1", pool="prefill"),
               TargetInfo("d0", pool="decode"), TargetInfo("d1", pool="decode"), TargetInfo("d2", pool="decode")]
    v = View(targets, outstanding_requests=[4, 2, 0, 1, 1], outstanding_tokens=[0, 0, 9000, 800, 500],
             healthy=[True, True, True, True, False])
    pol = make_policy("pd_pair")
    assert pol.choose_pair(req(), v) == (1, 3)  # d0 is emptiest by count but holds the most tokens; d2 is down
    by_requests = make_policy("pd_pair", {"decode_load": "requests"})
    assert by_requests.choose_pair(req(), v) == (1, 2)


def test_pd_pair_reports_a_missing_pool_and_falls_back_to_jsq_without_pools():
    v = View([TargetInfo("x"), TargetInfo("y")], outstanding_requests=[3, 1])
    pol = make_policy("pd_pair")
    assert pol.choose_pair(req(), v) is REJECT
    assert pol.choose(req(), v) == 1
