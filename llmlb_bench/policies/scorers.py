"""llm-d / Gateway API Inference Extension endpoint picker: filters, weighted
scorers, max-score picker.

The EPP runs a scheduling profile per request: filters narrow the candidate
endpoints, each scorer gives every candidate a score in [0, 1], the scores
are summed with the profile's weights and the max-score picker takes the
best (ties at random). This is the default profile of the GIE Helm chart
(``queue-scorer`` 2, ``kv-cache-utilization-scorer`` 2, ``prefix-cache-scorer`` 3):

* queue-scorer: ``(max_q - q) / (max_q - min_q)`` over candidates of the
  scraped waiting-queue length (1 for all when equal);
* kv-cache-utilization-scorer: ``1 - kv_usage`` (scraped);
* prefix-cache-scorer: matched blocks / blocks of the prompt (at most
  ``max_prefix_blocks``), from an LRU index of the EPP's own past picks with
  ``lru_capacity_per_server`` entries per endpoint; with ``precise`` the
  precise-prefix-cache-scorer reads the replicas' KV events instead;
* lora-affinity-scorer (``lora_weight``; not in the chart's default profile,
  so off by default; KServe turns it on for LoRA services): GIE's adapter
  score, :func:`llmlb_bench.policies.lora.adapter_score`.

Filters: low-queue-filter (waiting <= ``queue_threshold``, GIE default 128)
and a KV-cache filter (kv_usage <= ``kv_cache_threshold``, GIE's 0.8). As in
GIE's decision-tree filter, a filter that would leave no candidate is
skipped rather than failing the request.

Because queue and KV scores come from scraped metrics, this policy sees
stale signals when the backend's refresh interval is long.
"""

from __future__ import annotations

from random import Random

from llmlb_bench.policies.base import RouteRequest, View
from llmlb_bench.policies.lora import adapter_score
from llmlb_bench.policies.prefix_index import PrefixIndex, PrefixPredicting, overlap


class LlmdScorers(PrefixPredicting):
    name = "llm_d"
    summary = "llm-d endpoint picker: queue/KV filters, weighted prefix-cache + queue + KV-utilisation scores, max score."
    params = {
        "prefix_weight": (3.0, "weight of prefix-cache-scorer (matched / prompt blocks)"),
        "queue_weight": (2.0, "weight of queue-scorer (min-max normalised scraped waiting queue)"),
        "kv_weight": (2.0, "weight of kv-cache-utilization-scorer (1 - scraped KV usage)"),
        "queue_threshold": (128, "low-queue-filter: keep endpoints with waiting <= this"),
        "kv_cache_threshold": (0.8, "KV filter: keep endpoints with KV usage <= this (1 = off)"),
        "max_prefix_blocks": (256, "maxPrefixBlocksToMatch: prompt blocks considered"),
        "lru_capacity_per_server": (31250, "prefix index entries (blocks) remembered per endpoint"),
        "precise": (False, "use the backend's KV events (precise-prefix-cache-scorer) when it offers them"),
        "lora_weight": (0.0, "weight of lora-affinity-scorer (adapter active 1, free slot 0.8, queued 0.6)"),
        "seed": (0, "seed of the max-score picker's tie-break"),
    }

    def __init__(self, prefix_weight: float = 3.0, queue_weight: float = 2.0, kv_weight: float = 2.0,
                 queue_threshold: int = 128, kv_cache_threshold: float = 0.8, max_prefix_blocks: int = 256,
                 lru_capacity_per_server: int = 31250, precise: bool = False, lora_weight: float = 0.0,
                 seed: int = 0) -> None:
        if min(prefix_weight, queue_weight, kv_weight, lora_weight) < 0:
            raise ValueError("scorer weights must be >= 0")
        if max_prefix_blocks < 1 or lru_capacity_per_server < 1:
            raise ValueError("max_prefix_blocks and lru_capacity_per_server must be >= 1")
        self.prefix_weight, self.queue_weight, self.kv_weight = prefix_weight, queue_weight, kv_weight
        self.queue_threshold, self.kv_cache_threshold = queue_threshold, kv_cache_threshold
        self.max_prefix_blocks, self.lru_capacity_per_server = max_prefix_blocks, lru_capacity_per_server
        self.precise, self.seed, self.lora_weight = precise, seed, lora_weight
        self._rng = Random(seed)
        self.index = PrefixIndex(capacity=lru_capacity_per_server)
        self._match: list[int] = []
        self._cand: list[bool] = []

    def _filter(self, view: View) -> None:
        """Mark candidates: healthy, then each filter unless it would empty the set."""
        cand = self._cand
        for i in range(len(view)):
            cand[i] = view.healthy[i]
        for values, limit in ((view.waiting, self.queue_threshold), (view.kv_usage, self.kv_cache_threshold)):
            if any(c and values[i] <= limit for i, c in enumerate(cand)):
                for i, c in enumerate(cand):
                    if c and values[i] > limit:
                        cand[i] = False

    def choose(self, req: RouteRequest, view: View) -> int:
        n = len(view)
        if len(self._match) != n:
            self._match, self._cand = [0] * n, [False] * n
            self.index.ensure(n)
        self._filter(view)
        cand = self._cand
        if not any(cand):
            cand[:] = [True] * n
        hashes = req.prefix_hashes
        if len(hashes) > self.max_prefix_blocks:
            hashes = hashes[: self.max_prefix_blocks]
        total = len(hashes)
        if total and self.prefix_weight:
            overlap(view, self.index, hashes, self._match, self.precise)
        q_lo = min(view.waiting[i] for i in range(n) if cand[i])
        q_hi = max(view.waiting[i] for i in range(n) if cand[i])
        best_score, ties = -1.0, 0
        choice = 0
        for i in range(n):
            if not cand[i]:
                continue
            score = self.kv_weight * (1.0 - view.kv_usage[i])
            score += self.queue_weight * (1.0 if q_hi == q_lo else (q_hi - view.waiting[i]) / (q_hi - q_lo))
            if total and self.prefix_weight:
                score += self.prefix_weight * self._match[i] / total
            if self.lora_weight and req.adapter is not None:
                score += self.lora_weight * adapter_score(req.adapter, view.adapters[i])
            if score > best_score + 1e-12:
                best_score, choice, ties = score, i, 1
            elif abs(score - best_score) <= 1e-12:
                ties += 1  # reservoir sampling: each tied endpoint equally likely
                if self._rng.randrange(ties) == 0:
                    choice = i
        if hashes and not (self.precise and view.cached_prefix is not None):
            self.index.insert(hashes, choice, view.now)
        return choice

    def predicted_cached(self, req: RouteRequest, target: int, view: View) -> int | None:
        """None when the prefix scorer is off (``prefix_weight`` 0): then nothing was matched."""
        if not self.prefix_weight:
            return None
        hashes = req.prefix_hashes[: self.max_prefix_blocks]
        if not hashes:
            return 0
        return min(self._match[target] * view.block_size, req.input_tokens)
