"""NVIDIA Dynamo's KV router cost (``DefaultWorkerSelector``).

For every worker::

    logit = overlap_score_weight x prefill_blocks + decode_blocks

where ``prefill_blocks`` = (prompt tokens - cached overlap blocks x block
size) / block size is the prefill this worker would still have to compute,
and ``decode_blocks`` the KV blocks of requests active on it (the router's
own books, plus this request's). Lower is better. With
``router_temperature`` 0 the lowest logit wins (ties: smallest tree, then
random); above 0 the worker is sampled from a softmax of the negated logits
rescaled to [-1/T, 0] by their range, as in Dynamo's ``softmax_sample``.

Cache overlap comes from the replicas' KV events when ``use_kv_events`` and
the backend publishes them (``View.cached_prefix``), else from Dynamo's
``ApproxKvIndexer`` behaviour: blocks the router sent a worker are assumed
cached for ``router_ttl_s`` seconds. Active blocks count each in-flight
request's prompt blocks; Dynamo also grows them with generated tokens,
which a router that does not read the stream cannot see.
"""

from __future__ import annotations

import math
from random import Random

from llmlb_bench.policies.base import RouteRequest, View
from llmlb_bench.policies.prefix_index import PrefixIndex, PrefixPredicting, overlap


class DynamoKvCost(PrefixPredicting):
    name = "dynamo_kv"
    summary = "NVIDIA Dynamo KV router: min overlap_weight x new prefill blocks + active decode blocks (softmax if T > 0)."
    params = {
        "overlap_score_weight": (1.0, "weight of prefill blocks against decode blocks (0 = pure load balance)"),
        "router_temperature": (0.0, "softmax sampling temperature over normalised logits (0 = argmin)"),
        "use_kv_events": (True, "exact overlap from the backend's KV events when it publishes them"),
        "router_ttl_s": (120.0, "approximate mode: routed blocks count as cached for this long"),
        "seed": (0, "seed for softmax sampling and tie-breaks"),
    }

    def __init__(self, overlap_score_weight: float = 1.0, router_temperature: float = 0.0,
                 use_kv_events: bool = True, router_ttl_s: float = 120.0, seed: int = 0) -> None:
        if overlap_score_weight < 0 or router_temperature < 0 or router_ttl_s < 0:
            raise ValueError("overlap_score_weight, router_temperature and router_ttl_s must be >= 0")
        self.overlap_score_weight, self.router_temperature = overlap_score_weight, router_temperature
        self.use_kv_events, self.router_ttl_s, self.seed = use_kv_events, router_ttl_s, seed
        self._rng = Random(seed)
        self.index = PrefixIndex(ttl_s=router_ttl_s)
        self._match: list[int] = []
        self._logit: list[float] = []
        #: the router's books: prompt blocks of requests in flight on each worker
        self.active_blocks: list[int] = []

    def logits(self, req: RouteRequest, view: View) -> list[float]:
        """Per-worker cost of serving ``req`` (a buffer reused across calls)."""
        n = len(view)
        if len(self._match) != n:
            self._match, self._logit = [0] * n, [0.0] * n
            self.active_blocks.extend([0] * (n - len(self.active_blocks)))
            self.index.ensure(n)
        bs = view.block_size
        hashes = req.prefix_hashes
        self.index.expire(view.now)
        if hashes:
            overlap(view, self.index, hashes, self._match, self.use_kv_events)
        else:
            for i in range(n):
                self._match[i] = 0
        request_blocks = -(-req.input_tokens // bs)
        for i in range(n):
            prefill_tokens = max(0, req.input_tokens - self._match[i] * bs)
            self._logit[i] = self.overlap_score_weight * prefill_tokens / bs + self.active_blocks[i] + request_blocks
        return self._logit

    def choose(self, req: RouteRequest, view: View) -> int:
        logits = self.logits(req, view)
        live = [i for i in range(len(view)) if view.healthy[i]] or list(range(len(view)))
        if self.router_temperature == 0:
            low = min(logits[i] for i in live)
            tied = [i for i in live if logits[i] == low]
            if len(tied) > 1:
                smallest = min(self.index.size(i) for i in tied)
                tied = [i for i in tied if self.index.size(i) == smallest]
            target = tied[0] if len(tied) == 1 else tied[self._rng.randrange(len(tied))]
        else:
            target = self._softmax(logits, live)
        self.active_blocks[target] += -(-req.input_tokens // view.block_size)
        if req.prefix_hashes and not (self.use_kv_events and view.cached_prefix is not None):
            self.index.insert(req.prefix_hashes, target, view.now)
        return target

    def _softmax(self, logits: list[float], live: list[int]) -> int:
        lo = min(logits[i] for i in live)
        hi = max(logits[i] for i in live)
        if hi == lo:
            return live[self._rng.randrange(len(live))]
        scale = 1.0 / ((hi - lo) * self.router_temperature)
        weights = [math.exp(-(logits[i] - lo) * scale) for i in live]
        r = self._rng.random() * sum(weights)
        acc = 0.0
        for i, w in zip(live, weights):
            acc += w
            if r <= acc:
                return i
        return live[-1]

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        self.active_blocks[target] -= -(-req.input_tokens // view.block_size)
