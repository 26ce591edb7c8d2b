"""Queue- and SLO-aware routing with admission control.

* ``predicted_ttft``: Mooncake's conductor (Qin et al., FAST 2025, Algorithm
  1) picks the prefill instance with the smallest estimated TTFT = queueing
  time + prefill time of the tokens not already cached there, and rejects
  the request early when even the best estimate misses the TTFT SLO, rather
  than spend capacity on a request that will fail anyway.
* ``admission_control``: plain load shedding, as in a gateway's max-pending
  limit: join the shortest queue, but refuse when every target already has
  ``max_outstanding`` requests in flight.

A rejection is :data:`~llmlb_bench.policies.base.REJECT`; the backend writes
the request with status "rejected" and never sends it.
"""

from __future__ import annotations

from llmlb_bench.policies.base import REJECT, Decision, Policy, RouteRequest, View
from llmlb_bench.policies.prefix_index import PrefixIndex, PrefixPredicting, overlap


class PredictedTtft(PrefixPredicting):
    """Minimum predicted TTFT, with early rejection above the SLO.

    Each target is modelled as a FIFO prefill server at
    ``prefill_tokens_per_s x TargetInfo.capacity``: the router keeps the time
    its queue of already-routed prefills drains (``busy_until``), so the
    queueing estimate needs no scraped signal and is never stale. Cache hits
    come from KV events when the backend publishes them, else from the
    router's own prefix index. Decode interference with prefill is not
    modelled (Mooncake's prefill instances do not decode).
    """

    name = "predicted_ttft"
    summary = "Mooncake conductor: min predicted TTFT (queue + uncached prefill); reject early above the TTFT SLO."
    params = {
        "prefill_tokens_per_s": (10000.0, "prefill speed of a target of capacity 1"),
        "ttft_slo_s": (0.0, "reject when the best predicted TTFT exceeds this (0 = never reject)"),
        "use_kv_events": (True, "exact cache hits from the backend's KV events when it publishes them"),
        "max_tree_size": (2**20, "prefix blocks remembered per target in the router's own index (LRU)"),
    }

    def __init__(self, prefill_tokens_per_s: float = 10000.0, ttft_slo_s: float = 0.0, use_kv_events: bool = True,
                 max_tree_size: int = 2**20) -> None:
        if prefill_tokens_per_s <= 0 or ttft_slo_s < 0 or max_tree_size < 1:
            raise ValueError("prefill_tokens_per_s and max_tree_size must be > 0, ttft_slo_s >= 0")
        self.prefill_tokens_per_s, self.ttft_slo_s = prefill_tokens_per_s, ttft_slo_s
        self.use_kv_events, self.max_tree_size = use_kv_events, max_tree_size
        self.index = PrefixIndex(capacity=max_tree_size)
        self._match: list[int] = []
        self._ttft: list[float] = []
        self._busy_until: list[float] = []
        self._tie = 0

    def predicted(self, req: RouteRequest, view: View) -> list[float]:
        """Predicted TTFT per target, in seconds (valid until the next call)."""
        n = len(view)
        if len(self._match) != n:
            self._match, self._ttft = [0] * n, [0.0] * n
            self._busy_until.extend([0.0] * (n - len(self._busy_until)))
            self.index.ensure(n)
        if req.prefix_hashes:
            overlap(view, self.index, req.prefix_hashes, self._match, self.use_kv_events)
        else:
            for i in range(n):
                self._match[i] = 0
        out = self._ttft
        bs = view.block_size
        for i in range(n):
            uncached = max(0, req.input_tokens - self._match[i] * bs)
            rate = self.prefill_tokens_per_s * view.targets[i].capacity
            out[i] = max(0.0, self._busy_until[i] - view.now) + uncached / rate
        return out

    def choose(self, req: RouteRequest, view: View) -> Decision:
        """Smallest predicted TTFT; ties (idle targets, no cache) go to the fewest in
        flight, then rotate, so that an underloaded cluster is not served by one replica."""
        ttft = self.predicted(req, view)
        self._tie += 1
        n = len(view)
        target, best = -1, (0.0, 0)
        for k in range(n):
            i = (self._tie + k) % n
            if view.healthy[i]:
                key = (ttft[i], view.outstanding_requests[i])
                if target < 0 or key < best:
                    target, best = i, key
        if target < 0:
            target = self._tie % n
        if self.ttft_slo_s and ttft[target] > self.ttft_slo_s:
            return REJECT
        self._busy_until[target] = view.now + ttft[target]
        if req.prefix_hashes and not (self.use_kv_events and view.cached_prefix is not None):
            self.index.insert(req.prefix_hashes, target, view.now)
        return target


class AdmissionControl(Policy):
    name = "admission_control"
    summary = "Shortest queue, but reject when every target has max_outstanding requests in flight (load shedding)."
    params = {
        "max_outstanding": (128, "per-target in-flight limit (own count); at the limit everywhere, reject"),
        "max_outstanding_tokens": (0, "optional per-target limit on outstanding tokens (0 = off)"),
    }

    def __init__(self, max_outstanding: int = 128, max_outstanding_tokens: int = 0) -> None:
        if max_outstanding < 1 or max_outstanding_tokens < 0:
            raise ValueError("max_outstanding must be >= 1 and max_outstanding_tokens >= 0")
        self.max_outstanding, self.max_outstanding_tokens = max_outstanding, max_outstanding_tokens
        self._tie = 0

    def choose(self, req: RouteRequest, view: View) -> Decision:
        """Fewest in flight among targets under both limits; none under them -> REJECT.
        A target with nothing outstanding always admits, so one request larger
        than the token limit is not refused forever."""
        self._tie += 1
        n = len(view)
        cost = req.input_tokens + req.max_output_tokens
        best: Decision = REJECT
        best_load = 0
        for k in range(n):
            i = (self._tie + k) % n
            load = view.outstanding_requests[i]
            if not view.healthy[i] or load >= self.max_outstanding:
                continue
            tokens = view.outstanding_tokens[i]
            if self.max_outstanding_tokens and tokens and tokens + cost > self.max_outstanding_tokens:
                continue
            if best == REJECT or load < best_load:
                best, best_load = i, load
        return best
