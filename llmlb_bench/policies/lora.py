"""LoRA-affinity routing, after the Gateway API Inference Extension's lora-affinity scorer.

A request that names an adapter is cheapest where the adapter is already in
the running batch (no load, no wait for a slot), next where the batch has a
free adapter slot (one load over the host link), and worst where every slot
holds another adapter (the request waits in the engine until one frees:
vLLM's scheduler skips it). GIE's ``lora-affinity-scorer`` scores each
endpoint from its scraped ``vllm:lora_requests_info`` (:func:`adapter_score`):

* 1.0: the adapter is active (in ``running_lora_adapters``);
* 0.8: ``|running| + |waiting| < max_lora``, room to load one more;
* 0.6: the adapter is queued there (``waiting_lora_adapters``);
* 0.0: no room.

:class:`LoraAffinity` takes, like GIE's decision-tree filter, the endpoints
whose scraped waiting queue is at most ``queue_threshold`` (all of them when
that leaves none: load first, as GIE's low-queue filter), then the best score
among them, and breaks ties by the router's own outstanding requests (the
least-loaded endpoint), then by the lowest index. Requests for the base model
score alike everywhere, so they are routed by load alone; a fleet that
publishes no adapter state gets least-outstanding routing.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from llmlb_bench.policies.base import AdapterState, Policy, RouteRequest, View


def adapter_key(adapter: str) -> int:
    """The 64-bit key XOR-ed into every prefix hash of a request naming ``adapter``.

    KV computed under one adapter is not the base model's or another adapter's (vLLM's block
    hashes include the LoRA id, GIE's prefix index the model name), so equal prompts under
    different adapters share no cache. One key on every block of a request keeps the chain:
    two requests share leading blocks exactly when they did and name the same adapter."""
    return int.from_bytes(hashlib.blake2b(adapter.encode(), digest_size=8).digest(), "little")


def salted(hashes: Sequence[int], adapter: str | None) -> list[int]:
    """``hashes`` of a request naming ``adapter`` (unchanged for the base model)."""
    if adapter is None:
        return list(hashes)
    key = adapter_key(adapter)
    return [h ^ key for h in hashes]


def adapter_score(adapter: str | None, state: AdapterState | None) -> float:
    """GIE's lora-affinity score of one endpoint for a request naming ``adapter``."""
    if adapter is None or state is None:
        return 0.0
    if adapter in state.running:
        return 1.0
    if len(state.running) + len(state.waiting) < state.max_loras:
        return 0.8
    if adapter in state.waiting:
        return 0.6
    return 0.0


class LoraAffinity(Policy):
    name = "lora_affinity"
    summary = "GIE lora-affinity: adapter active > free adapter slot > queued; low-queue filter, least outstanding."
    params = {
        "queue_threshold": (128, "low-queue filter: consider endpoints with scraped waiting <= this first"),
    }

    def __init__(self, queue_threshold: int = 128) -> None:
        if queue_threshold < 0:
            raise ValueError("queue_threshold must be >= 0")
        self.queue_threshold = queue_threshold

    def choose(self, req: RouteRequest, view: View) -> int:
        healthy = [i for i in range(len(view)) if view.healthy[i]] or list(range(len(view)))
        low = [i for i in healthy if view.waiting[i] <= self.queue_threshold] or healthy
        adapters, out = view.adapters, view.outstanding_requests
        return min(low, key=lambda i: (-adapter_score(req.adapter, adapters[i]), out[i], i))


@dataclass(frozen=True)
class AdapterSnapshot:
    """A target's adapters as read at one instant: a scrape of vLLM's gauge, or the simulator's
    replica at a scrape tick (``signal_refresh_s`` > 0), so routers see them as stale as they are."""

    max_loras: int
    running: frozenset[str]
    waiting: frozenset[str]


class RoutedAdapters:
    """A target's adapters by a proxy's own books (``llmlb route``): the adapters of the requests
    it sent there that have not ended, as ``running`` (it cannot tell the engine's batch from its
    queue, so ``waiting`` stays empty), and ``max_loras`` as the engine last published it (0 until
    a scrape says, so a free slot is never assumed). Fresher than a scrape, which lags by its
    interval; blind to traffic that reaches the engine by another way."""

    def __init__(self) -> None:
        self.max_loras = 0
        self.running: Counter[str] = Counter()
        self.waiting: frozenset[str] = frozenset()

    def sent(self, adapter: str | None) -> None:
        if adapter is not None:
            self.running[adapter] += 1

    def ended(self, adapter: str | None) -> None:
        if adapter is not None:
            self.running[adapter] -= 1
            if self.running[adapter] <= 0:
                del self.running[adapter]
