"""Automatic prefix caching (vLLM v1): full KV blocks stay cached by hash after use.

Each cached *unit* is a run of full KV blocks named by a chained hash (so a
hash names its whole prefix, and matching walks a prompt's hashes from the
start). A unit is *referenced* while running requests use it; at reference
count zero it stays resident but evictable, in least-recently-used order.
When a request releases its units they are queued deepest first, so of one
prompt the tail goes before the head, as vLLM's free-block queue does.

Capacity: referenced units count as used blocks; unreferenced ones count as
free (an allocation may evict them), which is why the replica's
``total - used`` arithmetic needs no change, only an :meth:`evict_to` after
allocations.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class PrefixCache:
    """Cached units of ``unit_blocks`` KV blocks each, keyed by chained hash."""

    __slots__ = ("unit_blocks", "refs", "lru", "free_blocks", "hits", "lookups")

    def __init__(self, unit_blocks: int) -> None:
        self.unit_blocks = unit_blocks
        self.refs: dict[int, int] = {}
        #: unreferenced units, least recently used first
        self.lru: OrderedDict[int, None] = OrderedDict()
        #: blocks held by unreferenced (evictable) units
        self.free_blocks = 0
        self.hits = 0
        self.lookups = 0

    def match(self, hashes: Sequence[int], limit: int) -> int:
        """Number of leading units of ``hashes`` (at most ``limit``) resident now."""
        refs = self.refs
        k = 0
        for h in hashes:
            if k >= limit or h not in refs:
                break
            k += 1
        return k

    def revive_cost(self, hashes: Sequence[int], k: int) -> int:
        """Blocks that acquiring the first ``k`` units moves from free to used."""
        refs = self.refs
        return self.unit_blocks * sum(1 for i in range(k) if refs[hashes[i]] == 0)

    def acquire(self, hashes: Sequence[int], k: int) -> int:
        """Reference the first ``k`` units (all resident); returns blocks moved from free to used."""
        refs, lru = self.refs, self.lru
        revived = 0
        for i in range(k):
            h = hashes[i]
            rc = refs[h]
            if rc == 0:
                del lru[h]
                revived += self.unit_blocks
            refs[h] = rc + 1
        self.free_blocks -= revived
        return revived

    def register(self, hashes: Sequence[int], start: int, stop: int) -> int:
        """Units ``start..stop-1`` of a request have just been computed: cache them, referenced
        by it. Stops at the first hash already cached (another request computed the same
        prefix concurrently; vLLM keeps the first copy). Returns how many were registered."""
        refs = self.refs
        for i in range(start, stop):
            h = hashes[i]
            if h in refs:
                return i - start
            refs[h] = 1
        return stop - start

    def add_free(self, hashes: Sequence[int], start: int, stop: int) -> None:
        """Cache units ``start..stop-1`` as unreferenced (most recently used): KV that a finished
        request computed beyond its prompt (its reply), named by the hashes its next turn carries."""
        refs, lru = self.refs, self.lru
        for i in range(start, stop):
            h = hashes[i]
            if h not in refs:
                refs[h] = 0
                lru[h] = None
                self.free_blocks += self.unit_blocks

    def release(self, hashes: Sequence[int], k: int) -> int:
        """Drop one reference to each of the first ``k`` units; returns blocks that became free."""
        refs, lru = self.refs, self.lru
        freed = 0
        for i in range(k - 1, -1, -1):
            h = hashes[i]
            rc = refs[h] - 1
            refs[h] = rc
            if rc == 0:
                lru[h] = None
                freed += self.unit_blocks
        self.free_blocks += freed
        return freed

    def evict_to(self, room: int) -> None:
        """Evict least recently used free units until they hold at most ``room`` blocks."""
        lru, refs = self.lru, self.refs
        while self.free_blocks > room and lru:
            h, _ = lru.popitem(last=False)
            del refs[h]
            self.free_blocks -= self.unit_blocks

    def resident(self, hashes: Sequence[int]) -> int:
        """Leading units of ``hashes`` resident now (for the router's exact-cache view)."""
        return self.match(hashes, len(hashes))
