"""The router-side prefix index and the KV/locality-aware policies' decision rules."""

from __future__ import annotations

import math
import random
import zlib
from collections import Counter

import pytest
from scipy import stats

from llmlb_bench.policies import RouteRequest, TargetInfo, View, make_policy
from llmlb_bench.policies.prefix_index import PrefixIndex
from llmlb_bench.policies.base import set_now


def view(n: int = 4, **signals) -> View:
    return View([TargetInfo(f"r{i}") for i in range(n)], **signals)


def req(hashes=(), i: int = 0, input_tokens: int | None = None, **kw) -> RouteRequest:
    tokens = input_tokens if input_tokens is not None else 16 * max(len(hashes), 1)
    return RouteRequest(request_id=i, arrival_s=0.0, input_tokens=tokens, max_output_tokens=kw.pop("out", 32),
                        prefix_hashes=list(hashes), **kw)


def chain(prefix: str, n: int) -> list[int]:
    """n chained block hashes whose first blocks are shared by every chain with the same ``prefix``."""
    seed = zlib.crc32(prefix.encode())  # str hashes change per process; this does not
    return [hash((seed, k)) & (2**63 - 1) for k in range(n)]


# --- the index ---------------------------------------------------------------------------------

def test_index_reports_each_targets_leading_match():
    idx = PrefixIndex()
    idx.insert([1, 2, 3, 4], 0, 0.0)
    idx.insert([1, 2, 9], 1, 0.0)
    idx.insert([5], 2, 0.0)
    out = [0] * 4
    assert idx.match([1, 2, 3, 7], out) == 3
    assert out == [3, 2, 0, 0]
    assert idx.match([8], out) == 0 and out == [0, 0, 0, 0]
    assert idx.match([1, 2, 3, 4], out) == 4 and out[:2] == [4, 2]
    assert idx.size(0) == 4 and idx.size(1) == 3


def test_lru_eviction_takes_leaves_first_and_keeps_sets_prefix_closed():
    idx = PrefixIndex(capacity=5)
    idx.insert([1, 2, 3], 0, 0.0)  # old conversation
    idx.insert([1, 7, 8], 0, 1.0)  # newer one sharing block 1
    assert idx.size(0) == 5
    idx.insert([20, 21], 0, 2.0)  # needs two slots: the oldest leaves 3 then 2 go, not the shared root 1
    out = [0]
    assert idx.match([1, 7, 8], out) == 3
    assert idx.match([1, 2, 3], out) == 1
    assert idx.match([20, 21], out) == 2


def test_ttl_forgets_blocks_not_routed_recently():
    idx = PrefixIndex(ttl_s=10.0)
    idx.insert([1, 2], 0, 0.0)
    idx.insert([1, 3], 1, 8.0)
    idx.expire(12.0)
    out = [0, 0]
    assert idx.match([1, 2], out) == 1 and out == [0, 1]
    idx.expire(30.0)
    assert idx.match([1, 3], out) == 0


class ReferenceIndex:
    """The semantics spelled out, brute force: every block of a routed prompt is
    used at that moment; over capacity or past the TTL, the least recently
    used leaf of a target's tree goes, one at a time."""

    def __init__(self, capacity: int = 0, ttl_s: float = 0.0) -> None:
        self.capacity, self.ttl_s = capacity, ttl_s
        self.used: dict[int, dict[int, float]] = {}
        self.parent: dict[int, int | None] = {}

    def _leaves(self, t: int) -> list[int]:
        held = self.used[t]
        inner = {self.parent[h] for h in held}
        return [h for h in held if h not in inner]

    def insert(self, hashes, t: int, now: float) -> None:
        held = self.used.setdefault(t, {})
        for k, h in enumerate(hashes):
            held[h] = now
            self.parent[h] = hashes[k - 1] if k else None
        while self.capacity and len(held) > self.capacity:
            del held[min(self._leaves(t), key=held.__getitem__)]

    def expire(self, now: float) -> None:
        if not self.ttl_s:
            return
        for t, held in self.used.items():
            while held and min(held[h] for h in self._leaves(t)) < now - self.ttl_s:
                del held[min(self._leaves(t), key=held.__getitem__)]

    def depth(self, hashes, t: int) -> int:
        k = 0
        while k < len(hashes) and hashes[k] in self.used.get(t, {}):
            k += 1
        return k


@pytest.mark.parametrize("capacity, ttl", [(0, 0.0), (12, 0.0), (40, 0.0), (0, 5.0), (25, 8.0)])
def test_index_agrees_with_the_brute_force_lru_of_leaves(capacity, ttl):
    rng = random.Random(capacity * 7 + int(ttl))
    idx, ref = PrefixIndex(capacity=capacity, ttl_s=ttl), ReferenceIndex(capacity, ttl)
    prompts = [chain("root", 3)]
    out = [0] * 4
    for step in range(600):
        now = step * 0.1
        base = rng.choice(prompts)
        cut = rng.randrange(1, len(base) + 1)
        prompt = base[:cut] + [hash((step, k)) for k in range(rng.randrange(0, 6))]
        if len(prompts) < 60 or rng.random() < 0.3:
            prompts.append(prompt)
        target = rng.randrange(4)
        idx.expire(now)
        ref.expire(now)
        idx.insert(prompt, target, now)
        ref.insert(prompt, target, now)
        probe = rng.choice(prompts)
        best = idx.match(probe, out)
        expected = [ref.depth(probe, t) for t in range(4)]
        assert out == expected, f"step {step}"
        assert best == max(expected)
        assert [idx.size(t) for t in range(4)] == [len(ref.used.get(t, {})) for t in range(4)]


# --- SGLang cache_aware ----------------------------------------------------------------------

def test_cache_aware_follows_the_longest_match_above_the_threshold():
    pol = make_policy("cache_aware")
    v = view(4)
    doc = chain("doc", 10)
    first = pol.choose(req(doc), v)
    # another request sharing 8 of 10 blocks (match 0.8 > 0.3) goes to the same worker
    assert pol.choose(req(doc[:8] + chain("q2", 2)), v) == first
    assert pol.decisions["hit"] == 1


def test_cache_aware_low_match_goes_to_the_smallest_tree():
    pol = make_policy("cache_aware", {"cache_threshold": 0.5})
    v = view(3)
    pol.tree.insert(chain("a", 30), 0, 0.0)
    pol.tree.insert(chain("b", 5), 1, 0.0)
    pol.tree.insert(chain("c", 12), 2, 0.0)
    # shares 2 of 10 blocks with worker 0: 0.2 <= 0.5, so the smallest tree (worker 1) wins
    assert pol.choose(req(chain("a", 2) + chain("z", 8)), v) == 1
    assert pol.decisions["miss"] == 1


def test_cache_aware_imbalance_needs_both_thresholds_then_shortest_queue():
    pol = make_policy("cache_aware", {"balance_abs_threshold": 4, "balance_rel_threshold": 2.0})
    doc = chain("doc", 10)
    pol.tree.insert(doc, 0, 0.0)
    # max - min = 6 > 4 but 10 > 2 x 5: balanced, so the cache wins
    assert pol.choose(req(doc), view(3, outstanding_requests=[10, 5, 7])) == 0
    # 10 - 3 = 7 > 4 and 10 > 2 x 3: imbalanced, shortest queue
    assert pol.choose(req(doc), view(3, outstanding_requests=[10, 3, 7])) == 1
    assert pol.decisions == {"balance": 1, "hit": 1, "miss": 0}
    # the imbalanced decision still recorded the prefix on worker 1
    out = [0, 0, 0]
    assert pol.tree.match(doc, out) == 10 and out[1] == 10


def test_cache_aware_evicts_to_max_tree_size_every_interval():
    pol = make_policy("cache_aware", {"max_tree_size": 4, "eviction_interval_secs": 10.0})
    v = view(1)
    set_now(v, 1.0)
    pol.choose(req(chain("a", 6)), v)
    assert pol.tree.size(0) == 6  # not yet: the eviction thread has not run
    set_now(v, 12.0)
    pol.choose(req(chain("b", 2)), v)
    assert pol.tree.size(0) == 4 + 2  # evicted to 4 at t=12, then b inserted


# --- llm-d endpoint picker -------------------------------------------------------------------

def test_llm_d_sums_weighted_scores():
    pol = make_policy("llm_d")
    doc = chain("doc", 8)
    pol.index.insert(doc[:6], 2, 0.0)
    # target 2: prefix 3 x 6/8 = 2.25, queue 2 x (4 - 4)/(4 - 0) = 0, kv 2 x 0.5 = 1  -> 3.25
    # target 0: prefix 0, queue 2 x 1 = 2, kv 2 x 0.9 = 1.8                         -> 3.8
    v = view(3, waiting=[0, 2, 4], kv_usage=[0.1, 0.5, 0.5])
    assert pol.choose(req(doc), v) == 0
    # with a heavier prefix weight the cached endpoint wins
    heavy = make_policy("llm_d", {"prefix_weight": 5.0})
    heavy.index.insert(doc[:6], 2, 0.0)
    assert heavy.choose(req(doc), v) == 2


def test_llm_d_filters_drop_long_queues_and_full_kv_unless_none_would_remain():
    pol = make_policy("llm_d", {"queue_threshold": 5, "prefix_weight": 10.0})
    doc = chain("doc", 4)
    pol.index.insert(doc, 0, 0.0)
    v = view(3, waiting=[9, 1, 2], kv_usage=[0.1, 0.95, 0.5])
    assert pol.choose(req(doc), v) == 2  # 0 fails the queue filter, 1 the KV filter
    v2 = view(2, waiting=[9, 9], kv_usage=[0.1, 0.1])
    assert pol.choose(req(doc), v2) == 0  # every endpoint fails the queue filter: it is skipped


def test_llm_d_ties_are_broken_at_random_but_reproducibly():
    v = view(4)
    picks = [make_policy("llm_d", {"seed": s}).choose(req(), v) for s in range(200)]
    assert set(picks) == {0, 1, 2, 3}
    again = [make_policy("llm_d", {"seed": s}).choose(req(), v) for s in range(200)]
    assert picks == again


def test_llm_d_precise_mode_reads_kv_events():
    cached = {0: 0, 1: 4}
    v = view(2, cached_prefix=lambda i, h: cached[i])
    assert make_policy("llm_d", {"precise": True}).choose(req(chain("x", 4)), v) == 1


# --- NVIDIA Dynamo KV router -----------------------------------------------------------------

def test_dynamo_logit_is_weighted_prefill_blocks_plus_decode_blocks():
    pol = make_policy("dynamo_kv", {"overlap_score_weight": 2.0, "use_kv_events": False})
    v = view(2)
    doc = chain("doc", 10)
    pol.index.insert(doc[:6], 1, 0.0)
    pol.active_blocks = [3, 9]  # prompt blocks of requests already active there
    logits = pol.logits(req(doc, input_tokens=160), v)
    # worker 0: 2 x 160/16 + 3 + 10 = 33; worker 1: 2 x (160 - 96)/16 + 9 + 10 = 27
    assert logits == [33.0, 27.0]
    assert pol.choose(req(doc, input_tokens=160), v) == 1
    assert pol.active_blocks == [3, 19]
    pol.on_complete(req(doc, input_tokens=160), 1, v)
    assert pol.active_blocks == [3, 9]


def test_dynamo_weight_zero_is_pure_load_balancing():
    pol = make_policy("dynamo_kv", {"overlap_score_weight": 0.0, "use_kv_events": False})
    doc = chain("doc", 10)
    pol.index.insert(doc, 0, 0.0)
    pol.active_blocks = [5, 1]
    assert pol.choose(req(doc), view(2)) == 1


def test_dynamo_temperature_samples_the_normalised_softmax():
    pol = make_policy("dynamo_kv", {"router_temperature": 0.5, "seed": 1, "use_kv_events": False})
    v = view(3)
    pol.active_blocks = [0, 10, 20]  # logits 1, 11, 21 for a one-block request -> normalised 0, 0.5, 1
    counts = Counter()
    for i in range(6000):
        counts[pol.choose(req(i=i, input_tokens=16), v)] += 1
        pol.active_blocks = [0, 10, 20]
    weights = [math.exp(-x / 0.5) for x in (0.0, 0.5, 1.0)]
    expected = [6000 * w / sum(weights) for w in weights]
    assert stats.chisquare([counts[0], counts[1], counts[2]], expected).pvalue > 0.001


def test_dynamo_approximate_mode_forgets_after_router_ttl_and_uses_events_when_offered():
    pol = make_policy("dynamo_kv", {"use_kv_events": False, "router_ttl_s": 60.0})
    doc = chain("doc", 20)
    v = view(2)
    first = pol.choose(req(doc), v)
    pol.on_complete(req(doc), first, v)
    assert pol.choose(req(doc), v) == first
    pol.on_complete(req(doc), first, v)
    set_now(v, 30.0)
    assert pol.logits(req(doc), v)[first] < pol.logits(req(doc), v)[1 - first]
    set_now(v, 200.0)  # the routed blocks expired: no worker has a cache advantage any more
    low, high = sorted(pol.logits(req(doc), v))
    assert low == high
    events = make_policy("dynamo_kv")
    assert events.choose(req(doc), view(2, cached_prefix=lambda i, h: 20 * i)) == 1


# --- Preble ---------------------------------------------------------------------------------

def test_preble_exploits_when_cached_exceeds_missing_and_explores_otherwise():
    pol = make_policy("preble", {"tpot_s": 0.0})
    v = view(3)
    doc = chain("doc", 10)
    home = pol.choose(req(doc), v)
    # 8 of 10 blocks cached on `home`: exploit, even though `home` carries load
    assert pol.choose(req(doc[:8] + chain("q", 2)), v) == home
    # 2 of 10 cached: explore, the cheapest GPU by load + prefill cost is one without load
    other = pol.choose(req(doc[:2] + chain("r", 8)), v)
    assert other != home
    assert pol.decisions == {"exploit": 1, "explore": 2}


def test_preble_window_forgets_old_prefill_load():
    pol = make_policy("preble", {"window_s": 10.0, "tpot_s": 0.0})
    v = view(2)
    pol.choose(req(chain("a", 50)), v)
    assert max(pol.load(0), pol.load(1)) == pytest.approx(800 / 10000)
    set_now(v, 11.0)
    pol.choose(req(chain("b", 1)), v)
    assert sorted((pol.load(0), pol.load(1))) == pytest.approx([0.0, 16 / 10000])


def test_preble_explores_when_the_gpu_holding_the_prefix_is_down():
    pol = make_policy("preble")
    doc = chain("doc", 10)
    home = pol.choose(req(doc), view(3))
    healthy = [True] * 3
    healthy[home] = False
    assert pol.choose(req(doc), view(3, healthy=healthy)) != home
    assert pol.decisions == {"exploit": 0, "explore": 2}
