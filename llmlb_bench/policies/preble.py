"""Preble's E2 global scheduler (Srivatsa et al., ICLR 2025): exploit or explore.

For each request Preble finds the longest cached prefix over all GPUs in its
global prefix tree. If the cached part is longer than the part still to be
computed (``cached > missing``, i.e. a cached fraction above
``exploit_ratio`` = 0.5), it *exploits*: the request goes to a GPU that holds
that prefix, the least loaded of them. Otherwise it *explores*: every GPU is
priced at its load plus the prefill this request would cost there, and the
cheapest wins.

A GPU's load follows ``SlidingWindowHistogram.get_node_cost``: the prefill
time of the requests routed to it within the last ``window_s`` seconds
(Preble's 3-minute window; uncached tokens / ``prefill_tokens_per_s``) plus
the decode time of its in-flight requests (requested output tokens x
``tpot_s``). Preble fits both speeds from profiles at run time; here they
are parameters. Preble's eviction-cost term is off by default in its code
(``enable_eviction=False``) and its load rebalancing / prefix autoscaling
is commented out there; neither is modelled.
"""

from __future__ import annotations

from collections import deque

from llmlb_bench.policies.base import RouteRequest, View
from llmlb_bench.policies.prefix_index import PrefixIndex, PrefixPredicting


class Preble(PrefixPredicting):
    name = "preble"
    summary = "Preble E2: exploit the GPU holding the prefix when cached > missing, else explore by load + prefill cost."
    params = {
        "exploit_ratio": (0.5, "exploit when the cached fraction of the prompt exceeds this (cached > missing)"),
        "window_s": (180.0, "sliding window of recent prefill load (Preble: 3 minutes)"),
        "prefill_tokens_per_s": (10000.0, "prefill speed used to price uncached tokens (per unit capacity)"),
        "tpot_s": (0.03, "time per output token used to price in-flight decodes"),
        "max_tree_size": (2**20, "prefix blocks remembered per GPU (LRU)"),
    }

    def __init__(self, exploit_ratio: float = 0.5, window_s: float = 180.0, prefill_tokens_per_s: float = 10000.0,
                 tpot_s: float = 0.03, max_tree_size: int = 2**20) -> None:
        if not 0.0 <= exploit_ratio <= 1.0:
            raise ValueError(f"exploit_ratio must be in [0, 1] (got {exploit_ratio})")
        if window_s <= 0 or prefill_tokens_per_s <= 0 or tpot_s < 0 or max_tree_size < 1:
            raise ValueError("window_s, prefill_tokens_per_s, max_tree_size must be > 0 and tpot_s >= 0")
        self.exploit_ratio, self.window_s = exploit_ratio, window_s
        self.prefill_tokens_per_s, self.tpot_s, self.max_tree_size = prefill_tokens_per_s, tpot_s, max_tree_size
        self.tree = PrefixIndex(capacity=max_tree_size)
        self._match: list[int] = []
        self._prefill_load: list[float] = []
        self._decode_load: list[float] = []
        self._window: deque[tuple[float, int, float]] = deque()
        #: decisions taken by each branch, for inspection
        self.decisions = {"exploit": 0, "explore": 0}

    def _grow(self, n: int) -> None:
        self._match = [0] * n
        self._prefill_load.extend([0.0] * (n - len(self._prefill_load)))
        self._decode_load.extend([0.0] * (n - len(self._decode_load)))
        self.tree.ensure(n)

    def load(self, i: int) -> float:
        """Seconds of work Preble attributes to GPU ``i`` now."""
        return self._prefill_load[i] + self._decode_load[i]

    def _cheapest(self, req: RouteRequest, view: View, depth: int) -> int:
        """Exploit (``depth`` >= 0): the least loaded healthy GPU matching ``depth`` blocks.
        Explore (``depth`` < 0): the healthy GPU with the least load + prefill cost."""
        bs = view.block_size
        target, best_cost = -1, 0.0
        for i in range(len(view)):
            if not view.healthy[i] or (depth >= 0 and self._match[i] != depth):
                continue
            cost = self.load(i)
            if depth < 0:
                uncached = max(0, req.input_tokens - self._match[i] * bs)
                cost += uncached / (self.prefill_tokens_per_s * view.targets[i].capacity)
            if target < 0 or cost < best_cost:
                target, best_cost = i, cost
        return target

    def choose(self, req: RouteRequest, view: View) -> int:
        n = len(view)
        if len(self._match) != n:
            self._grow(n)
        horizon = view.now - self.window_s
        while self._window and self._window[0][0] < horizon:
            _, i, cost = self._window.popleft()
            self._prefill_load[i] -= cost
        hashes = req.prefix_hashes
        best = self.tree.match(hashes, self._match) if hashes else 0
        bs = view.block_size
        cached = min(best * bs, req.input_tokens)
        exploit = req.input_tokens > 0 and cached > self.exploit_ratio * req.input_tokens
        target = self._cheapest(req, view, best if exploit else -1)
        if target < 0:  # no healthy GPU holds the prefix: explore instead
            exploit = False
            target = self._cheapest(req, view, -1)
        if target < 0:
            target = 0
        self.decisions["exploit" if exploit else "explore"] += 1
        uncached = max(0, req.input_tokens - self._match[target] * bs)
        prefill = uncached / (self.prefill_tokens_per_s * view.targets[target].capacity)
        self._prefill_load[target] += prefill
        self._window.append((view.now, target, prefill))
        self._decode_load[target] += req.max_output_tokens * self.tpot_s
        if hashes:
            self.tree.insert(hashes, target, view.now)
        return target

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        self._decode_load[target] -= req.max_output_tokens * self.tpot_s
