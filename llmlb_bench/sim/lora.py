"""LoRA adapter slots of one replica, as vLLM serves many adapters on one base model.

What vLLM (v1) does, and what is modelled here:

* ``max_loras``: at most this many distinct adapters in one running batch. The
  scheduler skips a waiting request whose adapter is not in the batch while the
  batch already holds ``max_loras`` adapters, and goes on with the next waiting
  request; skipped requests keep their place at the head of the queue
  (``vllm/v1/core/sched/scheduler.py``, ``scheduled_loras``). Base-model requests
  never wait for a slot.
* GPU slots: the worker keeps ``max_loras`` adapters in GPU memory
  (``LRUCacheWorkerLoRAManager``); an adapter that joins the batch while not
  resident is copied in over the host link before the step's forward pass,
  evicting the least recently used resident adapter that is not in the batch.
  The copy costs ``adapter bytes per GPU / host_link_gb_s`` and lengthens that
  step, as KV swap copies do (sim/replica.py).
* CPU cache: ``max_cpu_loras`` adapters (vLLM's default: ``max_loras``) stay in
  host memory; an adapter not there is first read from storage, at
  ``lora_fetch_gb_s``, into it (least recently used out).
* Memory: vLLM preallocates every GPU slot at the largest rank for every
  linear layer it can adapt, so ``max_loras`` adapter-sized buffers per GPU
  come off the KV cache.

An adapter's size follows from its rank and the model's shapes: rank r on a
linear layer of d_in -> d_out adds A (r x d_in) and B (d_out x r), so
r (d_in + d_out) weights, over the seven projections of every layer (q, k, v,
o, gate, up, down: vLLM's slots cover all of them), in the model's weight
bytes; ``lora_adapter_mib`` gives it instead. Tensor and pipeline parallelism
shard every adapter like its layers, so each GPU holds and copies 1/(tp x pp) of it.

Not modelled: the extra compute of the LoRA kernels (punica/SGMV: 2 r (d_in +
d_out) flops per token per projection, under 1% of the base model's at rank 16)
and adapters loaded and unloaded at run time through vLLM's API.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from dataclasses import dataclass
from llmlb_bench.policies.lora import AdapterSnapshot
from llmlb_bench.sim.catalog import Model
from llmlb_bench.sim.cost import CostModel
from llmlb_bench.sim.profile import ProfileCost

#: ranks vLLM accepts for --max-lora-rank (vllm/config/lora.py)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MIB = 1 << 20


def adapter_bytes(model: Model, rank: int) -> float:
    """Bytes of a rank-``rank`` adapter on every linear projection of ``model`` (whole, unsharded)."""
    h, q, kv, inter = model.hidden, model.heads * model.head_dim, model.kv_heads * model.head_dim, model.intermediate
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h)
    return float(model.layers * rank * per_layer * model.weight_bytes)


@dataclass(frozen=True)
class LoraCosts:
    """A pool's adapter settings, resolved for its replicas."""

    max_loras: int
    max_cpu_loras: int
    #: bytes of one adapter on one GPU (its 1/tp shard)
    bytes_per_gpu: float
    #: seconds to copy an adapter from host memory into a GPU slot
    load_s: float
    #: seconds to read an adapter from storage into the host cache
    fetch_s: float
    #: KV blocks the preallocated GPU slots take from the cache
    reserved_blocks: int


def lora_costs(max_loras: int, max_cpu_loras: int | None, rank: int, adapter_mib: float | None,
               fetch_gb_s: float, cost: CostModel | ProfileCost) -> LoraCosts | None:
    """A pool's adapter costs on its cost model (None without LoRA: ``max_loras`` = 0). A measured
    profile's KV blocks already are what its vLLM had left, so nothing is reserved from them."""
    if not max_loras:
        return None
    whole = adapter_mib * MIB if adapter_mib is not None else adapter_bytes(cost.model, rank)
    per_gpu = whole / (cost.tp * cost.pp)
    reserved = (math.ceil(max_loras * per_gpu / (cost.kv_bytes_per_token_gpu * cost.block_size))
                if isinstance(cost, CostModel) else 0)
    return LoraCosts(max_loras=max_loras, max_cpu_loras=max_cpu_loras or max_loras, bytes_per_gpu=per_gpu,
                     load_s=per_gpu / (cost.gpu.host_link_gb_s * 1e9), fetch_s=whole / (fetch_gb_s * 1e9),
                     reserved_blocks=reserved)


class AdapterSlots:
    """One replica's adapters: those in its running batch and waiting queue (what vLLM's
    ``vllm:lora_requests_info`` publishes, read by routers as a
    :class:`~llmlb_bench.policies.AdapterState`), its GPU slots and host cache, and the
    loads it made."""

    def __init__(self, costs: LoraCosts) -> None:
        self.costs = costs
        self.max_loras = costs.max_loras
        #: running requests per adapter (the batch's adapters are its keys)
        self.running: Counter[str] = Counter()
        #: waiting requests per adapter
        self.waiting: Counter[str] = Counter()
        self._gpu: OrderedDict[str, None] = OrderedDict()   # resident adapters, least recently used first
        self._cpu: OrderedDict[str, None] = OrderedDict()
        #: adapters copied into a GPU slot, and read from storage, so far; seconds those took
        self.loads = self.fetches = 0
        self.load_time_s = 0.0

    def can_join(self, adapter: str | None) -> bool:
        """Whether a request for ``adapter`` may join the running batch now."""
        return adapter is None or adapter in self.running or len(self.running) < self.max_loras

    def enqueue(self, adapter: str | None) -> None:
        if adapter is not None:
            self.waiting[adapter] += 1

    def dequeue(self, adapter: str | None) -> None:
        """A waiting request left the queue without running (aborted)."""
        if adapter is not None:
            _drop(self.waiting, adapter)

    def join(self, adapter: str | None) -> float:
        """A waiting request for ``adapter`` joins the batch; returns the seconds of loading it
        costs the step (0 when resident)."""
        if adapter is None:
            return 0.0
        _drop(self.waiting, adapter)
        self.running[adapter] += 1
        if adapter in self._gpu:
            self._gpu.move_to_end(adapter)
            return 0.0
        seconds = self._fetch(adapter) + self.costs.load_s
        if len(self._gpu) >= self.max_loras:
            del self._gpu[next(a for a in self._gpu if a not in self.running)]
        self._gpu[adapter] = None
        self.loads += 1
        self.load_time_s += seconds
        return seconds

    def leave(self, adapter: str | None) -> None:
        """A running request for ``adapter`` left the batch (finished, handed over, preempted)."""
        if adapter is not None:
            _drop(self.running, adapter)

    def clear(self) -> None:
        """The replica failed: requests and every loaded adapter are gone."""
        self.running.clear()
        self.waiting.clear()
        self._gpu.clear()
        self._cpu.clear()

    def snapshot(self) -> AdapterSnapshot:
        """The batch's and the queue's adapters now, frozen (what a scrape would read)."""
        return AdapterSnapshot(self.max_loras, frozenset(self.running), frozenset(self.waiting))

    @property
    def resident(self) -> tuple[str, ...]:
        """Adapters in GPU slots, least recently used first."""
        return tuple(self._gpu)

    def _fetch(self, adapter: str) -> float:
        if adapter in self._cpu:
            self._cpu.move_to_end(adapter)
            return 0.0
        if len(self._cpu) >= self.costs.max_cpu_loras:
            # max_cpu_loras >= max_loras > adapters running before this one: one is idle
            del self._cpu[next(a for a in self._cpu if a not in self.running)]
        self._cpu[adapter] = None
        self.fetches += 1
        return self.costs.fetch_s


def _drop(counts: Counter[str], key: str) -> None:
    left = counts[key] - 1
    if left > 0:
        counts[key] = left
    else:
        del counts[key]
