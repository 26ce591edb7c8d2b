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


class _Unit:
    """A cached unit's reference count, held in the cache's dict as an object so that one look-up by
    hash both reads and changes it (an int value takes a second look-up to store the new count)."""

    __slots__ = ("refs",)

    def __init__(self, refs: int) -> None:
        self.refs = refs


class PrefixCache:
    """Cached units of ``unit_blocks`` KV blocks each, keyed by chained hash.

    Admission asks :meth:`match`, then :meth:`revive_cost` and :meth:`acquire` for the same prompt:
    the units the match found are kept (``_found``, for the hashes ``_found_for``) and the two
    calls read them instead of looking every hash up again; an eviction, the only change that
    takes a unit out of the dict, forgets them. The look-ups by 64-bit hash are most of what the
    cache costs a run."""

    __slots__ = ("unit_blocks", "units", "lru", "free_blocks", "hits", "lookups", "_found", "_found_for")

    def __init__(self, unit_blocks: int) -> None:
        self.unit_blocks = unit_blocks
        self.units: dict[int, _Unit] = {}
        #: unreferenced units, least recently used first
        self.lru: OrderedDict[int, None] = OrderedDict()
        #: blocks held by unreferenced (evictable) units
        self.free_blocks = 0
        self.hits = 0
        self.lookups = 0
        self._found: list[_Unit] = []
        self._found_for: Sequence[int] | None = None

    def match(self, hashes: Sequence[int], limit: int) -> int:
        """Number of leading units of ``hashes`` (at most ``limit``) resident now."""
        units = self.units
        found = self._found
        found.clear()
        for h in hashes:
            if len(found) >= limit:
                break
            u = units.get(h)
            if u is None:
                break
            found.append(u)
        self._found_for = hashes
        return len(found)

    def _leading(self, hashes: Sequence[int], k: int) -> list[_Unit]:
        """The first ``k`` units of ``hashes`` (all resident): those the last match found, else looked up."""
        if hashes is self._found_for and k <= len(self._found):
            return self._found
        units = self.units
        return [units[hashes[i]] for i in range(k)]

    def revive_cost(self, hashes: Sequence[int], k: int) -> int:
        """Blocks that acquiring the first ``k`` units moves from free to used."""
        found = self._leading(hashes, k)
        return self.unit_blocks * sum(1 for i in range(k) if found[i].refs == 0)

    def acquire(self, hashes: Sequence[int], k: int) -> int:
        """Reference the first ``k`` units (all resident); returns blocks moved from free to used."""
        found, lru = self._leading(hashes, k), self.lru
        revived = 0
        for i in range(k):
            u = found[i]
            if u.refs == 0:
                del lru[hashes[i]]
                revived += self.unit_blocks
            u.refs += 1
        self.free_blocks -= revived
        return revived

    def register(self, hashes: Sequence[int], start: int, stop: int) -> int:
        """Units ``start..stop-1`` of a request have just been computed: cache them, referenced
        by it. Stops at the first hash already cached (another request computed the same
        prefix concurrently; vLLM keeps the first copy). Returns how many were registered."""
        units = self.units
        for i in range(start, stop):
            h = hashes[i]
            if h in units:
                return i - start
            units[h] = _Unit(1)
        return stop - start

    def add_free(self, hashes: Sequence[int], start: int, stop: int) -> None:
        """Cache units ``start..stop-1`` as unreferenced (most recently used): KV that a finished
        request computed beyond its prompt (its reply), named by the hashes its next turn carries."""
        units, lru = self.units, self.lru
        for i in range(start, stop):
            h = hashes[i]
            if h not in units:
                units[h] = _Unit(0)
                lru[h] = None
                self.free_blocks += self.unit_blocks

    def release(self, hashes: Sequence[int], k: int) -> int:
        """Drop one reference to each of the first ``k`` units; returns blocks that became free."""
        units, lru = self.units, self.lru
        freed = 0
        for i in range(k - 1, -1, -1):
            h = hashes[i]
            u = units[h]
            u.refs -= 1
            if u.refs == 0:
                lru[h] = None
                freed += self.unit_blocks
        self.free_blocks += freed
        return freed

    def evict_to(self, room: int) -> None:
        """Evict least recently used free units until they hold at most ``room`` blocks."""
        lru, units = self.lru, self.units
        if self.free_blocks > room and lru:
            self._found_for = None          # the units the last match found may go
        while self.free_blocks > room and lru:
            h, _ = lru.popitem(last=False)
            del units[h]
            self.free_blocks -= self.unit_blocks

    def resident(self, hashes: Sequence[int]) -> int:
        """Leading units of ``hashes`` resident now (for the router's exact-cache view)."""
        return self.match(hashes, len(hashes))
