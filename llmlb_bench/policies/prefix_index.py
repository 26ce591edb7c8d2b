"""An approximate, router-side index of which target caches which prompt prefix.

Real cache-aware routers (SGLang's approximate radix tree, llm-d's prefix
indexer, Dynamo's ApproxKvIndexer) cannot see the replicas' KV caches; they
remember where they *sent* each prefix and forget it by LRU or by age. This
is the same structure over the trace's ``prefix_hashes``.

Those hashes are *chained*: hash ``k`` identifies the whole prompt up to and
including block ``k``. A radix tree over such hashes needs no edge labels: a
node is its hash, its parent the previous hash of any prompt containing it.
So the tree is a flat dict ``hash -> bitmask of targets holding it``, and a
lookup is a few dict probes (bisection over the prompt's blocks, below).

Each target's blocks form a tree (a block's parent is the block before it
in the prompt that brought it). Eviction takes the least recently used
*leaf*, as SGLang's tree does, so a target's set stays prefix-closed
(holding block k implies holding every block before it). That is what lets
lookups and insertions find a matched depth by bisection instead of walking
the prompt. A touch stamps only the prompt's deepest block: an inner block's
recency is the latest stamp in its subtree, which it inherits when its last
child is evicted, so LRU order is exact without re-stamping a whole path.

Cost per request: O(log prompt blocks) dict probes per run of equal holder
sets in a lookup (at most targets + 1 runs, typically one or two); an
insertion costs O(log prompt blocks) plus O(1) per block new to the target;
eviction and expiry are amortised O(log n) per evicted block.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Sequence

from llmlb_bench.policies.base import Policy, RouteRequest, View


class _Tree:
    """One target's blocks: last-use stamps, parent links, child counts, and a
    heap of (stamp, block) for leaves (stale entries are skipped lazily)."""

    __slots__ = ("stamp", "parent", "kids", "heap")

    def __init__(self) -> None:
        self.stamp: dict[int, int] = {}
        self.parent: dict[int, int | None] = {}
        self.kids: dict[int, int] = {}
        self.heap: list[tuple[int, int]] = []


class PrefixIndex:
    """Per-target prefix trees over block hashes, with LRU capacity and/or age limit."""

    __slots__ = ("capacity", "ttl_s", "_holders", "_trees", "_clock", "_checkpoints")

    def __init__(self, capacity: int = 0, ttl_s: float = 0.0) -> None:
        #: most blocks remembered per target (0 = unbounded); beyond it the LRU leaf goes
        self.capacity = capacity
        #: forget blocks not routed for this long (0 = never), Dynamo's ``router_ttl``
        self.ttl_s = ttl_s
        self._holders: dict[int, int] = {}
        self._trees: list[_Tree] = []
        self._clock = 0
        #: (time, clock) of each insertion, for age-based expiry
        self._checkpoints: deque[tuple[float, int]] = deque()

    def ensure(self, n: int) -> None:
        """Make room for targets ``0..n-1`` (targets may be added while running)."""
        while len(self._trees) < n:
            self._trees.append(_Tree())

    def size(self, target: int) -> int:
        """Blocks remembered for ``target`` (the 'tree size' of SGLang and Dynamo)."""
        return len(self._trees[target].stamp) if target < len(self._trees) else 0

    def match(self, hashes: Sequence[int], out: list[int]) -> int:
        """Set ``out[i]`` to the number of leading blocks of ``hashes`` target ``i``
        holds; return the longest match over all targets.

        The set of targets holding block k shrinks (weakly) as k grows, so it
        is constant on runs of depths; each run's end is found by bisection.
        """
        for i in range(len(out)):
            out[i] = 0
        n = len(hashes)
        get = self._holders.get
        alive = get(hashes[0], 0) if n else 0
        depth = 0  # blocks matched by every target in `alive`
        while alive:
            # the last index j >= depth whose block every target in `alive` still holds
            lo, hi = depth, n - 1
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if get(hashes[mid], 0) & alive == alive:
                    lo = mid
                else:
                    hi = mid - 1
            depth = lo + 1
            nxt = get(hashes[depth], 0) & alive if depth < n else 0
            dropped = alive & ~nxt
            while dropped:
                low = dropped & -dropped
                t = low.bit_length() - 1
                if t < len(out):
                    out[t] = depth
                dropped ^= low
            if not nxt:
                return depth
            alive = nxt
        return depth

    def held(self, hashes: Sequence[int], target: int) -> int:
        """Leading blocks of ``hashes`` that ``target`` holds (bisection over its set)."""
        stamp = self._trees[target].stamp if target < len(self._trees) else {}
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if hashes[mid - 1] in stamp:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def insert(self, hashes: Sequence[int], target: int, now: float) -> None:
        """Record that ``target`` now caches the prompt ``hashes`` (a use of every block)."""
        n = len(hashes)
        if not n:
            return
        self.ensure(target + 1)
        tree = self._trees[target]
        stamp, kids = tree.stamp, tree.kids
        self._clock += 1
        clock = self._clock
        have = self.held(hashes, target)
        if have < n:
            holders, parent = self._holders, tree.parent
            bit = 1 << target
            prev = hashes[have - 1] if have else None
            if prev is not None:
                kids[prev] += 1
            for k in range(have, n):
                h = hashes[k]
                holders[h] = holders.get(h, 0) | bit
                stamp[h] = clock
                parent[h] = prev
                kids[h] = 1
                prev = h
            kids[hashes[n - 1]] = 0         # the new leaf
        last = hashes[n - 1]
        stamp[last] = clock
        if not kids[last]:
            heapq.heappush(tree.heap, (clock, last))
        if self.ttl_s:
            self._checkpoints.append((now, clock))
        if self.capacity and len(stamp) > self.capacity:
            self.evict(target, self.capacity)
        elif len(tree.heap) > 2 * len(stamp) + 1024:
            tree.heap = [(c, h) for c, h in tree.heap if stamp.get(h) == c and not kids[h]]
            heapq.heapify(tree.heap)

    def evict(self, target: int, max_blocks: int) -> None:
        """Drop ``target``'s least recently used leaves until it holds at most ``max_blocks``."""
        tree = self._trees[target]
        while len(tree.stamp) > max_blocks and tree.heap:
            self._pop_leaf(tree, target)

    def expire(self, now: float) -> None:
        """Drop blocks no routed prompt has used for ``ttl_s`` seconds (no-op without a TTL)."""
        if not self.ttl_s:
            return
        horizon = now - self.ttl_s
        cut = 0  # stamps below this were last used before the horizon
        checkpoints = self._checkpoints
        while checkpoints and checkpoints[0][0] < horizon:
            cut = checkpoints.popleft()[1] + 1
        if not cut:
            return
        for target, tree in enumerate(self._trees):
            while tree.heap and tree.heap[0][0] < cut:
                self._pop_leaf(tree, target)

    def _pop_leaf(self, tree: _Tree, target: int) -> None:
        """Evict the least recently used leaf; its parent inherits the stamp if it becomes a leaf."""
        clock, h = heapq.heappop(tree.heap)
        stamp, kids = tree.stamp, tree.kids
        if stamp.get(h) != clock or kids[h]:
            return  # stale entry: re-used since, or no longer a leaf
        del stamp[h], kids[h]
        p = tree.parent.pop(h)
        m = self._holders[h] & ~(1 << target)
        if m:
            self._holders[h] = m
        else:
            del self._holders[h]
        if p is not None and p in stamp:
            kids[p] -= 1
            if not kids[p]:
                if stamp[p] < clock:
                    stamp[p] = clock
                heapq.heappush(tree.heap, (stamp[p], p))


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


class PrefixPredicting(Policy):
    """A policy that, for each request, fills ``_match[i]`` with the leading blocks it believes
    target ``i`` caches (from its own index or KV events) before choosing. Its prediction for the
    chosen target is that match in tokens, which is what it routed on; what the replica then
    delivers is the request's ``cached_tokens`` (docs/prefix-cache.md)."""

    _match: list[int]

    def predicted_cached(self, req: RouteRequest, target: int, view: View) -> int | None:
        if not req.prefix_hashes:
            return 0
        return min(self._match[target] * view.block_size, req.input_tokens)
