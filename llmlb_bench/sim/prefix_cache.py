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

The free units' order is a queue of units with lazy removal: a unit is queued
each time it becomes free, a unit referenced again stays queued, and eviction
skips the entries of a unit that is referenced or queued again later (each unit
counts its entries). That is the order an ordered dict of free units kept (an
insertion at each release, a deletion at each reuse), without its per-unit
hashing: the look-ups by 64-bit hash are most of what the cache costs a run.
"""

from __future__ import annotations

from typing import Sequence


class _Unit:
    """A cached unit: its hash, how many running requests reference it, and how many entries it has
    in the free queue (the last one is its place there while it is free). An object in the cache's
    dict, so that one look-up by hash both reads and changes it."""

    __slots__ = ("hash", "refs", "queued")

    def __init__(self, h: int, refs: int) -> None:
        self.hash = h
        self.refs = refs
        self.queued = 0


class PrefixCache:
    """Cached units of ``unit_blocks`` KV blocks each, keyed by chained hash.

    Admission asks :meth:`match`, then :meth:`revive_cost` and :meth:`acquire` for the same prompt:
    the units the match found are kept (``_found``, for the hashes ``_found_for``) and the two
    calls read them instead of looking every hash up again; an eviction, the only change that
    takes a unit out of the dict, forgets them."""

    __slots__ = ("unit_blocks", "units", "queue", "head", "free_blocks", "hits", "lookups", "_found",
                 "_found_for")

    def __init__(self, unit_blocks: int) -> None:
        self.unit_blocks = unit_blocks
        self.units: dict[int, _Unit] = {}
        #: units in the order they became free, least recently used first from ``head`` on; an
        #: entry counts only if it is its unit's last and the unit is still free
        self.queue: list[_Unit] = []
        self.head = 0
        #: blocks held by unreferenced (evictable) units
        self.free_blocks = 0
        self.hits = 0
        self.lookups = 0
        self._found: list[_Unit] = []
        self._found_for: Sequence[int] | None = None

    def _free(self, u: _Unit) -> None:
        """Queue ``u``, just become free, as the most recently used; drop the stale entries when
        they outnumber the free units (a cache that never evicts would otherwise keep them all)."""
        u.queued += 1
        queue = self.queue
        queue.append(u)
        if len(queue) - self.head > 2 * (self.free_blocks // self.unit_blocks) + 1024:
            kept: list[_Unit] = []
            for k in range(self.head, len(queue)):
                v = queue[k]
                v.queued -= 1
                if not v.queued and not v.refs:
                    kept.append(v)
            for v in kept:
                v.queued = 1
            self.queue = kept
            self.head = 0

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
        """Reference the first ``k`` units (all resident); returns blocks moved from free to used
        (their queue entries stay, skipped by eviction)."""
        found = self._leading(hashes, k)
        revived = 0
        for i in range(k):
            u = found[i]
            if u.refs == 0:
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
            units[h] = _Unit(h, 1)
        return stop - start

    def add_free(self, hashes: Sequence[int], start: int, stop: int) -> None:
        """Cache units ``start..stop-1`` as unreferenced (most recently used): KV that a finished
        request computed beyond its prompt (its reply), named by the hashes its next turn carries."""
        units = self.units
        for i in range(start, stop):
            h = hashes[i]
            if h not in units:
                u = units[h] = _Unit(h, 0)
                self.free_blocks += self.unit_blocks
                self._free(u)

    def release(self, hashes: Sequence[int], k: int) -> int:
        """Drop one reference to each of the first ``k`` units; returns blocks that became free."""
        units = self.units
        freed = 0
        for i in range(k - 1, -1, -1):
            u = units[hashes[i]]
            u.refs -= 1
            if u.refs == 0:
                self.free_blocks += self.unit_blocks
                freed += self.unit_blocks
                self._free(u)
        return freed

    def evict_to(self, room: int) -> None:
        """Evict least recently used free units until they hold at most ``room`` blocks."""
        if self.free_blocks <= room or not self.free_blocks:
            return
        self._found_for = None              # the units the last match found may go
        queue, units = self.queue, self.units
        head = self.head
        while self.free_blocks > room and self.free_blocks:
            u = queue[head]
            head += 1
            u.queued -= 1
            if not u.queued and not u.refs:
                del units[u.hash]
                self.free_blocks -= self.unit_blocks
        if head > 1024 and 2 * head > len(queue):
            del queue[:head]
            head = 0
        self.head = head

    def resident(self, hashes: Sequence[int]) -> int:
        """Leading units of ``hashes`` resident now (for the router's exact-cache view)."""
        return self.match(hashes, len(hashes))
