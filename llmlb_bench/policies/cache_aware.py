"""SGLang router's ``cache_aware`` policy (sgl-router / SGLang Model Gateway).

Decision rule, as in ``policies/cache_aware.rs``:

1. Load = in-flight requests per worker, the router's own count. The system
   is *imbalanced* when ``max - min > balance_abs_threshold`` **and**
   ``max > balance_rel_threshold x min``; then the request goes to the least
   loaded worker (shortest queue), and its prefix is still recorded there.
2. Otherwise look the prompt up in the approximate radix tree of what was
   sent where. If the matched fraction exceeds ``cache_threshold``, send it to
   the worker holding the longest match; if not, to the worker with the
   smallest tree (the most free cache, by the router's reckoning).
3. Every ``eviction_interval_secs`` each worker's tree is cut back to
   ``max_tree_size`` by least-recently-used leaves.

Differences from the source, forced by what a trace holds: the tree is over
the trace's prefix blocks instead of prompt characters, so ``max_tree_size``
counts blocks (default 2^20 blocks of 16 tokens = SGLang's 2^26 characters
at about 4 characters per token); where several workers share the longest
match (SGLang takes whichever its hash map yields first) the least loaded
wins, so that runs are deterministic.
"""

from __future__ import annotations

from llmlb_bench.policies.base import RouteRequest, View
from llmlb_bench.policies.prefix_index import PrefixIndex, PrefixPredicting
from llmlb_bench.policies.select import argmin_healthy, healthy_min_max


class CacheAware(PrefixPredicting):
    name = "cache_aware"
    summary = "SGLang router: longest cached prefix unless load is imbalanced (then shortest queue); LRU radix tree."
    params = {
        "cache_threshold": (0.3, "min matched fraction of the prompt to follow the cache; else smallest tree"),
        "balance_abs_threshold": (64, "imbalanced if max - min in-flight exceeds this ..."),
        "balance_rel_threshold": (1.5, "... and max > this x min; then route to the shortest queue"),
        "eviction_interval_secs": (60.0, "seconds between LRU evictions of the trees (0 = never evict)"),
        "max_tree_size": (2**20, "prefix blocks kept per worker tree at each eviction"),
    }

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5, eviction_interval_secs: float = 60.0,
                 max_tree_size: int = 2**20) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1] (got {cache_threshold})")
        if max_tree_size < 1:
            raise ValueError(f"max_tree_size must be >= 1 (got {max_tree_size})")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_secs = eviction_interval_secs
        self.max_tree_size = max_tree_size
        self.tree = PrefixIndex()
        self._match: list[int] = []
        self._last_eviction = 0.0
        self._tie = 0
        #: decisions taken by each branch, for inspection: imbalanced, cache hit, cache miss
        self.decisions = {"balance": 0, "hit": 0, "miss": 0}

    def choose(self, req: RouteRequest, view: View) -> int:
        n = len(view)
        if len(self._match) != n:
            self._match = [0] * n
            self.tree.ensure(n)
        if self.eviction_interval_secs > 0 and view.now - self._last_eviction >= self.eviction_interval_secs:
            for i in range(n):
                self.tree.evict(i, self.max_tree_size)
            self._last_eviction = view.now
        self._tie += 1
        loads = view.outstanding_requests
        lo, hi = healthy_min_max(loads, view)
        hashes = req.prefix_hashes
        # matched in every branch (a lookup changes nothing), so the recorded prediction is what
        # the tree believed about the chosen worker even when load alone chose it
        best = self.tree.match(hashes, self._match) if hashes else 0
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            self.decisions["balance"] += 1
            target = argmin_healthy(loads, view, self._tie)
        else:
            rate = best / len(hashes) if hashes else 0.0
            if rate > self.cache_threshold:
                self.decisions["hit"] += 1
                target = self._least_loaded_with(best, view)
            else:
                self.decisions["miss"] += 1
                target = self._smallest_tree(view)
        if hashes:
            self.tree.insert(hashes, target, view.now)
        return target

    def _least_loaded_with(self, depth: int, view: View) -> int:
        """Among healthy workers matching ``depth`` blocks, the fewest in flight."""
        n = len(view)
        best, best_load = -1, 0
        for k in range(n):
            i = (self._tie + k) % n
            if view.healthy[i] and self._match[i] == depth:
                load = view.outstanding_requests[i]
                if best < 0 or load < best_load:
                    best, best_load = i, load
        return best if best >= 0 else argmin_healthy(view.outstanding_requests, view, self._tie)

    def _smallest_tree(self, view: View) -> int:
        """Healthy worker with the fewest remembered blocks; ties by load, then rotation."""
        n = len(view)
        best, best_key = -1, (0, 0)
        for k in range(n):
            i = (self._tie + k) % n
            if view.healthy[i]:
                key = (self.tree.size(i), view.outstanding_requests[i])
                if best < 0 or key < best_key:
                    best, best_key = i, key
        return best if best >= 0 else self._tie % n
