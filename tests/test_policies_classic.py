"""Decision rules of the classic routing policies on hand-built views."""

from __future__ import annotations

from collections import Counter

import pytest
from scipy import stats

from llmlb_bench.policies import RouteRequest, TargetInfo, View, make_policy
from llmlb_bench.policies.affinity import ConsistentHash
from llmlb_bench.policies.base import fill


def view(n: int = 4, **signals) -> View:
    return View([TargetInfo(f"r{i}") for i in range(n)], **signals)


def req(i: int = 0, **kw) -> RouteRequest:
    return RouteRequest(request_id=i, arrival_s=0.0, input_tokens=kw.pop("input_tokens", 100),
                        max_output_tokens=kw.pop("max_output_tokens", 50), **kw)


def test_random_is_uniform_over_healthy_targets_and_seeded():
    v = view(5, healthy=[True, True, False, True, True])
    pol = make_policy("random", {"seed": 7})
    counts = Counter(pol.choose(req(i), v) for i in range(20000))
    assert 2 not in counts
    chi2 = stats.chisquare([counts[i] for i in (0, 1, 3, 4)])
    assert chi2.pvalue > 0.001


def test_random_same_seed_same_sequence():
    v = view(6)
    a, b = make_policy("random", {"seed": 3}), make_policy("random", {"seed": 3})
    assert [a.choose(req(i), v) for i in range(100)] == [b.choose(req(i), v) for i in range(100)]
    c, d = make_policy("random", {"seed": 4}), make_policy("random", {"seed": 3})
    assert [c.choose(req(i), v) for i in range(100)] != [d.choose(req(i), v) for i in range(100)]


def test_round_robin_cycles_and_skips_unhealthy():
    v = view(3, healthy=[True, False, True])
    pol = make_policy("round_robin")
    assert [pol.choose(req(), v) for _ in range(4)] == [0, 2, 0, 2]


def test_least_outstanding_joins_the_shortest_queue():
    v = view(4, outstanding_requests=[3, 1, 2, 1], healthy=[True, False, True, True])
    pol = make_policy("least_outstanding")
    assert pol.choose(req(), v) == 3


def test_least_tokens_uses_outstanding_tokens_not_counts():
    v = view(3, outstanding_requests=[1, 5, 5], outstanding_tokens=[9000, 300, 400])
    assert make_policy("least_tokens").choose(req(), v) == 1


def test_ties_rotate_instead_of_filling_target_zero():
    v = view(4)
    pol = make_policy("least_outstanding")
    assert len({pol.choose(req(), v) for _ in range(4)}) == 4


def test_power_of_two_picks_the_less_loaded_of_its_sample():
    v = view(10, outstanding_requests=list(range(10)))
    pol = make_policy("power_of_d", {"seed": 1})
    picks = [pol.choose(req(), v) for _ in range(20000)]
    # the minimum of two distinct uniform draws from 0..9: P(min = k) = 2(9 - k) / 90
    counts = Counter(picks)
    expected = [20000 * 2 * (9 - k) / 90 for k in range(10)]
    assert counts[9] == 0
    assert stats.chisquare([counts[k] for k in range(9)], expected[:9]).pvalue > 0.001


def test_power_of_d_with_d_equal_n_is_jsq_and_d1_ignores_load():
    v = view(5, outstanding_requests=[4, 2, 0, 3, 1])
    assert {make_policy("power_of_d", {"d": 5}).choose(req(), v) for _ in range(20)} == {2}
    assert len({make_policy("power_of_d", {"d": 1, "seed": s}).choose(req(), v) for s in range(40)}) == 5


def test_power_of_d_by_tokens_and_never_unhealthy():
    v = view(3, outstanding_requests=[0, 9, 9], outstanding_tokens=[900, 10, 20], healthy=[True, True, False])
    pol = make_policy("power_of_d", {"d": 3, "load": "tokens"})
    assert pol.choose(req(), v) == 1


def test_consistent_hash_keeps_sessions_and_falls_back_to_tenant_then_request():
    v = view(8)
    pol = make_policy("consistent_hash")
    firsts = {s: pol.choose(req(s, session_id=s), v) for s in range(200)}
    for s in range(200):
        assert pol.choose(req(1000 + s, session_id=s), v) == firsts[s]
    assert len(set(firsts.values())) == 8  # sessions spread over every replica
    tenant_targets = {pol.choose(req(i, tenant="acme"), v) for i in range(30)}
    assert len(tenant_targets) == 1
    request_targets = {pol.choose(req(i), v) for i in range(300)}
    assert len(request_targets) == 8  # default tenant, no session: hashed per request


def test_consistent_hash_moves_about_one_over_n_plus_one_sessions_when_a_replica_is_added():
    before, after = ConsistentHash(), ConsistentHash()
    v8, v9 = view(8), view(9)
    moved = sum(before.choose(req(s, session_id=s), v8) != after.choose(req(s, session_id=s), v9)
                for s in range(20000))
    assert moved / 20000 == pytest.approx(1 / 9, abs=0.03)


def test_consistent_hash_skips_unhealthy_and_bounded_load_skips_full_targets():
    pol = make_policy("consistent_hash")
    home = pol.choose(req(0, session_id=42), view(4))
    healthy = [True] * 4
    healthy[home] = False
    assert pol.choose(req(1, session_id=42), view(4, healthy=healthy)) != home
    bounded = make_policy("consistent_hash", {"load_factor": 1.25})
    load = [0, 0, 0, 0]
    load[home] = 10  # cap = ceil(1.25 * (10 + 1) / 4) = 4: home is full
    assert bounded.choose(req(2, session_id=42), view(4, outstanding_requests=load)) != home
    load = [1, 1, 1, 1]  # cap = ceil(1.25 * (4 + 1) / 4) = 2: home has room
    assert bounded.choose(req(3, session_id=42), view(4, outstanding_requests=load)) == home


def test_argmin_healthy_is_the_first_smallest_healthy_value_from_start_on():
    """The scan every load-aware policy uses, against its definition, with and without unhealthy targets
    (the all-healthy case takes a faster path), on lists and tuples; and the built-in picks' own pass
    over typed lists (books.fewest), the same rule."""
    import random

    from llmlb_bench.policies.books import fewest
    from llmlb_bench.policies.select import argmin_healthy

    rng = random.Random(7)
    for _ in range(5000):
        n = rng.randint(1, 12)
        v = view(n)
        fill(v, "healthy", [True] * n if rng.random() < 0.5 else [rng.random() < 0.7 for _ in range(n)])
        values = [rng.randint(0, 3) for _ in range(n)]
        start = rng.randint(0, 40)
        order = [(start + k) % n for k in range(n)]
        healthy = [i for i in order if v.healthy[i]]
        expected = min(healthy, key=lambda i: (values[i], order.index(i))) if healthy else start % n
        assert argmin_healthy(values, v, start) == expected
        assert argmin_healthy(tuple(values), v, start) == expected
        assert fewest(values, list(v.healthy), start) == expected


@pytest.mark.parametrize("name, args", [("least_outstanding", {}), ("least_outstanding", {"load": "scraped"}),
                                        ("round_robin", {}), ("random", {"seed": 5}), ("fewest_waiting", {})])
def test_picked_policies_pickle_with_their_state(name, args):
    """A process-pool backend (the replayer's) ships the policy by pickle: a built-in policy's compiled
    pick comes back with its state (tie rotation, next target, random stream) and decides the same."""
    import pickle

    v = view(5, outstanding_requests=[1, 0, 0, 2, 0], waiting=[0, 1, 0, 0, 0], healthy=[True, True, False, True, True])
    pol = make_policy(name, args)
    for i in range(7):
        pol.choose(req(i), v)
    copy = pickle.loads(pickle.dumps(pol))
    assert [copy.choose(req(i), v) for i in range(20)] == [pol.choose(req(i), v) for i in range(20)]
