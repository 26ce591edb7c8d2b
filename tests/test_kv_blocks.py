"""The KV block pool on its own (sim/kv_blocks.py): what the scheduler's calls do to the block
counts, the prefix cache and the swap space. The simulator's end-to-end invariants (blocks held =
blocks counted, swap space never over-committed) are checked in test_sim_core and test_sim_swap."""

from __future__ import annotations

import pytest

from llmlb_bench.policies import RouteRequest
from llmlb_bench.sim.kv_blocks import KVBlocks
from llmlb_bench.sim.replica import Request

BS = 16
#: host-link seconds per block: a Llama-3-8B block (2 MiB) over 25 GB/s
BLOCK_S = 2 * 32 * 8 * 128 * 2 * BS / 25e9


def _req(i: int, prompt: int, hashes: list[int] | None = None) -> Request:
    return Request(i, RouteRequest(i, 0.0, prompt, 10), prompt, 10, hashes)


def test_blocks_round_tokens_up():
    kv = KVBlocks(100, BS)
    assert [kv.blocks(t) for t in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_shared_prefix_units_go_back_to_the_cache_and_count_as_free():
    """Two requests share the first two 2-block units of their prompt: the second takes only its
    own blocks; when both leave, the shared units stay cached but free, and trimming evicts them
    least recently used first (deepest unit of a prompt first)."""
    kv = KVBlocks(100, BS, prefix_unit_blocks=2)
    cache = kv.cache
    assert cache is not None
    a, b = _req(0, 80, [11, 12]), _req(1, 80, [11, 12])
    kv.used += 5                          # a's 80 tokens: 5 blocks, computed ...
    a.blocks = 5
    a.shared = cache.register([11, 12], 0, 2)   # ... its two full units join the cache
    assert a.shared == 2 and kv.used == 5
    assert cache.match([11, 12], 2) == 2
    kv.acquire_prefix(b, 2)                # b reuses them: referenced already, nothing revived
    assert (b.shared, b.blocks, kv.used) == (2, 4, 5)
    kv.used += 1                          # b's own fifth block
    b.blocks += 1
    assert kv.used == 6
    kv.release(a, 5)                       # a's private block back; the units stay referenced by b
    assert kv.used == 6 - 1 and a.blocks == a.shared == 0
    kv.release(b, 5)                       # b's private block back, and the units become free
    assert kv.used == 0 and cache.free_blocks == 4
    kv.trim_cache(98)                      # room for 98 - 0 = 98 free: keep 2 blocks of cached units
    assert cache.free_blocks == 2 and cache.match([11, 12], 2) == 1   # the deeper unit went first


def test_swap_out_until_the_space_is_full_then_recompute():
    kv = KVBlocks(100, BS, swap_blocks=50, swap_block_s=BLOCK_S)
    reqs = [_req(i, 320) for i in range(3)]
    copies = [kv.swap_out(r, 20, True) for r in reqs]
    assert copies[:2] == [20 * BLOCK_S, 20 * BLOCK_S] and copies[2] is None
    assert (kv.swap_used, kv.swap_outs, kv.swap_fallbacks) == (40, 2, 1)
    assert [r for r, _, _ in kv.swapped] == [reqs[1], reqs[0]]     # the most recently swapped first
    assert kv.swap_in() == pytest.approx(20 * BLOCK_S)            # reqs[1] back: its blocks are used again
    assert (kv.used, kv.swap_used, kv.swap_ins) == (20, 20, 1)
    assert kv.drop_swapped(reqs[2]) is False                     # never swapped (recomputed)
    assert kv.drop_swapped(reqs[0]) is True and kv.swap_used == 0 and not kv.swapped


def test_a_failed_replica_loses_blocks_swap_and_cache():
    kv = KVBlocks(100, BS, prefix_unit_blocks=1, swap_blocks=50, swap_block_s=BLOCK_S)
    assert kv.cache is not None
    kv.cache.add_free([7], 0, 1)
    kv.used += 30
    kv.swap_out(_req(0, 160), 10, False)
    kv.lose_all()
    assert (kv.used, kv.swap_used, len(kv.swapped)) == (0, 0, 0)
    assert kv.cache is not None and kv.cache.match([7], 1) == 0 and kv.cache.unit_blocks == 1


class _ReferenceCache:
    """The prefix cache's semantics spelled out: reference counts by hash and the free units in an
    ordered dict (queued when they become free, taken out when reused, evicted from the front)."""

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}
        self.free: dict[int, None] = {}

    def match(self, hashes: list[int], limit: int) -> int:
        k = 0
        while k < min(limit, len(hashes)) and hashes[k] in self.refs:
            k += 1
        return k

    def acquire(self, hashes: list[int], k: int) -> int:
        revived = 0
        for h in hashes[:k]:
            if self.refs[h] == 0:
                del self.free[h]
                revived += 1
            self.refs[h] += 1
        return revived

    def register(self, hashes: list[int], start: int, stop: int) -> int:
        for i in range(start, stop):
            if hashes[i] in self.refs:
                return i - start
            self.refs[hashes[i]] = 1
        return stop - start

    def release(self, hashes: list[int], k: int) -> int:
        freed = 0
        for h in reversed(hashes[:k]):
            self.refs[h] -= 1
            if self.refs[h] == 0:
                self.free[h] = None
                freed += 1
        return freed

    def add_free(self, hashes: list[int], start: int, stop: int) -> None:
        for h in hashes[start:stop]:
            if h not in self.refs:
                self.refs[h] = 0
                self.free[h] = None

    def evict_to(self, room: int) -> None:
        while len(self.free) > room:
            h = next(iter(self.free))
            del self.free[h], self.refs[h]


@pytest.mark.parametrize("seed", range(4))
def test_prefix_cache_agrees_with_an_ordered_dict_of_free_units(seed):
    """Random prompts sharing prefixes (and tails from a small pool, so that free units are reused
    often) go through match, revive_cost, acquire, register, release, add_free and evict_to; the
    cache's lazily cleaned queue of free units evicts exactly what an ordered dict would, in the
    same order, also once its stale entries have been dropped."""
    import random

    from llmlb_bench.sim.prefix_cache import PrefixCache

    rng = random.Random(seed)
    cache, ref = PrefixCache(1), _ReferenceCache()
    held: list[tuple[list[int], int]] = []          # running requests: (hashes, units referenced)
    queue, compacted = cache.queue, 0
    for _ in range(12000):
        if held and (rng.random() < 0.45 or len(held) > 12):
            hashes, k = held.pop(rng.randrange(len(held)))
            assert cache.release(hashes, k) == ref.release(hashes, k)
            if rng.random() < 0.3:                   # its reply stays cached, free
                extra = hashes + [10**6 + j for j in rng.sample(range(30), 2)]
                cache.add_free(extra, len(hashes), len(extra))
                ref.add_free(extra, len(hashes), len(extra))
        else:
            root = rng.randrange(8)
            hashes = [root * 1000 + j for j in range(rng.randrange(1, 6))]
            hashes += [10**7 + j for j in rng.sample(range(30), rng.randrange(0, 4))]
            k = cache.match(hashes, len(hashes) - 1)
            assert k == ref.match(hashes, len(hashes) - 1)
            revive = cache.revive_cost(hashes, k)
            assert cache.acquire(hashes, k) == revive == ref.acquire(hashes, k)
            new = cache.register(hashes, k, len(hashes))
            assert new == ref.register(hashes, k, len(hashes))
            held.append((hashes, k + new))
        if rng.random() < 0.001:                     # rare enough for stale entries to pile up
            room = rng.randrange(0, 60)
            cache.evict_to(room)
            ref.evict_to(room)
        assert cache.free_blocks == len(ref.free)
        assert set(cache.units) == set(ref.refs)
        assert all(cache.units[h].refs == n for h, n in ref.refs.items())
        compacted += cache.queue is not queue
        queue = cache.queue
    assert compacted                                # the stale entries were dropped along the way
