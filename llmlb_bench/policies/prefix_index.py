"""An approximate, router-side index of which target caches which prompt prefix.

Real cache-aware routers (SGLang's approximate radix tree, llm-d's prefix
indexer, Dynamo's ApproxKvIndexer) cannot see the replicas' KV caches; they
remember where they *sent* each prefix and forget it by LRU or by age. This
is the same structure over the trace's ``prefix_hashes``.

Those hashes are *chained*: hash ``k`` identifies the whole prompt up to and
including block ``k``. A radix tree over such hashes needs no edge labels: a
node is its hash, its parent the previous hash of any prompt containing it.
So the tree is a flat dict ``hash -> bitmask of targets holding it``, and a
lookup walks the prompt's hashes until no target holds the next one, which
is O(prefix length) with no per-node allocation.

Each target's set is prefix-closed (holding block k implies holding every
block before it), because insertion touches a prompt's blocks deepest first
and eviction takes the least recently touched block: an ancestor is always
touched after its descendants, so a leaf always goes first, as in SGLang's
leaf-first LRU eviction.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

from llmlb_bench.policies.base import View


class PrefixIndex:
    """Per-target sets of prefix blocks, with LRU capacity and/or age limit."""

    __slots__ = ("capacity", "ttl_s", "_holders", "_lru")

    def __init__(self, capacity: int = 0, ttl_s: float = 0.0) -> None:
        #: most blocks remembered per target (0 = unbounded); beyond it the LRU leaf goes
        self.capacity = capacity
        #: forget blocks not routed for this long (0 = never), Dynamo's ``router_ttl``
        self.ttl_s = ttl_s
        self._holders: dict[int, int] = {}
        self._lru: list[OrderedDict[int, float]] = []

    def ensure(self, n: int) -> None:
        """Make room for targets ``0..n-1`` (targets may be added while running)."""
        while len(self._lru) < n:
            self._lru.append(OrderedDict())

    def size(self, target: int) -> int:
        """Blocks remembered for ``target`` (the 'tree size' of SGLang and Dynamo)."""
        return len(self._lru[target]) if target < len(self._lru) else 0

    def match(self, hashes: Sequence[int], out: list[int]) -> int:
        """Set ``out[i]`` to the number of leading blocks of ``hashes`` target ``i``
        holds; return the longest match over all targets."""
        for i in range(len(out)):
            out[i] = 0
        holders = self._holders
        alive = -1  # targets still matching at this depth
        depth = 0
        for h in hashes:
            m = holders.get(h, 0) & alive
            if m != alive and depth:
                dropped = alive & ~m
                while dropped:
                    low = dropped & -dropped
                    t = low.bit_length() - 1
                    if t < len(out):
                        out[t] = depth
                    dropped ^= low
            if not m:
                return depth
            alive = m
            depth += 1
        while alive > 0:
            low = alive & -alive
            t = low.bit_length() - 1
            if t < len(out):
                out[t] = depth
            alive ^= low
        return depth

    def insert(self, hashes: Sequence[int], target: int, now: float) -> None:
        """Record that ``target`` now caches the prompt ``hashes`` (touches every block)."""
        self.ensure(target + 1)
        lru = self._lru[target]
        holders = self._holders
        bit = 1 << target
        for h in reversed(hashes):  # deepest first: ancestors end up fresher than descendants
            if h in lru:
                lru.move_to_end(h)
            else:
                holders[h] = holders.get(h, 0) | bit
            lru[h] = now
        if self.capacity and len(lru) > self.capacity:
            self.evict(target, self.capacity)

    def evict(self, target: int, max_blocks: int) -> None:
        """Drop ``target``'s least recently routed blocks until it holds at most ``max_blocks``."""
        lru = self._lru[target]
        while len(lru) > max_blocks:
            h, _ = lru.popitem(last=False)
            self._forget(h, target)

    def expire(self, now: float) -> None:
        """Drop blocks not touched for ``ttl_s`` seconds (no-op without a TTL)."""
        if not self.ttl_s:
            return
        horizon = now - self.ttl_s
        for target, lru in enumerate(self._lru):
            while lru:
                h, t = next(iter(lru.items()))
                if t >= horizon:
                    break
                lru.popitem(last=False)
                self._forget(h, target)

    def _forget(self, h: int, target: int) -> None:
        m = self._holders[h] & ~(1 << target)
        if m:
            self._holders[h] = m
        else:
            del self._holders[h]


def overlap(view: View, index: PrefixIndex, hashes: Sequence[int], out: list[int], use_events: bool) -> int:
    """Leading cached blocks of ``hashes`` per target into ``out``; returns the best.

    Exact, from the backend's KV events (``view.cached_prefix``), when
    ``use_events`` and the view carries them; otherwise the router's own
    approximate ``index``.
    """
    events = view.cached_prefix
    if use_events and events is not None:
        best = 0
        for i in range(len(out)):
            v = out[i] = events(i, hashes) if hashes else 0
            if v > best:
                best = v
        return best
    return index.match(hashes, out)
