"""The fleet: a run's replicas, the router's view of them, and their life cycle.

Replicas are created from the configured pools at the start and by the
autoscaler later; they fail and recover, drain and retire. The fleet keeps
``View.targets`` and the view's per-target lists in step with the replicas
(targets are only appended, so indices stay valid) and ``View.healthy[i]``
equal to "routable": not starting, draining, down or retired.
"""

from __future__ import annotations

from typing import Callable, Sequence

import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.policies import TargetInfo, View
from llmlb_bench.policies.base import add_target, put
from llmlb_bench.sim.autoscale import PoolStatus
from llmlb_bench.sim.catalog import load_catalog
from llmlb_bench.sim.config import ClusterConfig, PoolConfig
from llmlb_bench.sim.cost import CostModel
from llmlb_bench.sim.jitter import StepJitter
from llmlb_bench.sim.lora import lora_costs
from llmlb_bench.sim.moe import ExpertLoad, MoeSpec
from llmlb_bench.sim.profile import EngineProfile, ProfileCost
from llmlb_bench.sim.replica import Replica
from llmlb_bench.sim.scheduling import make_engine_scheduler
from llmlb_bench.sim.speculative import Speculation


def cost_model(pool: PoolConfig, catalogs: tuple[str, ...] = (),
               moe: MoeSpec | None = None) -> CostModel | ProfileCost:
    """The pool's cost model: its measured profile's when it has one, else the roofline; ``moe``
    (``ClusterConfig.moe_spec``) gives a roofline MoE pool its own expert-load state."""
    model = pool.model_spec(catalogs)
    if pool.profile is not None:
        return ProfileCost(EngineProfile.of(pool.profile), model, pool.gpu_spec(catalogs), pool.tp, pool.pp)
    load = (ExpertLoad(moe, model.experts, model.active_experts, pool.tp)
            if moe is not None and model.is_moe else None)
    return CostModel(model, pool.gpu_spec(catalogs), pool.tp, pp=pool.pp,
                     max_num_batched_tokens=pool.max_num_batched_tokens, max_num_seqs=pool.max_num_seqs,
                     gpu_memory_utilization=pool.gpu_memory_utilization, block_size=pool.block_size,
                     expert_load=load, gpu_clock=float(pool.gpu_clock), power_cap_w=pool.power_cap_w)


def prefix_unit(pool: PoolConfig, trace_bs: int) -> tuple[int, int]:
    """Prefix-cache granularity for a pool: (KV blocks per cached unit, trace hashes per unit).

    A unit is the larger of the trace's hash block and the engine's KV block; one must divide the other.
    """
    bs = pool.block_size
    if trace_bs % bs == 0:
        return trace_bs // bs, 1
    if bs % trace_bs == 0:
        return 1, bs // trace_bs
    raise UserError(f"the trace's prefix-hash block size {trace_bs} and the engine block size {bs} "
                    f"must divide one another (or disable prefix caching)", f"cluster.pools[{pool.name}].block_size")


def speculation(pool: PoolConfig, cost: CostModel | ProfileCost, catalogs: tuple[str, ...],
                trace: pa.Table | None, seed: int) -> Speculation | None:
    """The pool's proposer (None without speculative settings); acceptance rates per row of
    ``trace`` when there is one."""
    spec = pool.speculative_spec
    if spec is None:
        return None
    draft = (CostModel(load_catalog(catalogs).model(spec.draft_model), pool.gpu_spec(catalogs), pool.tp)
             if spec.draft_model is not None else None)
    rates = Speculation.class_rates(spec, trace) if trace is not None else None
    return Speculation(spec, cost, draft, pool.model_spec(catalogs).layers, rates, seed)


def decode_capacity(cost: CostModel | ProfileCost) -> float:
    """Serving speed for ``TargetInfo.capacity``: decode tokens/s of a 64-request batch at 1k context."""
    return 64 / cost.decode_time(64, 64 * 1024)


class Fleet:
    """Replicas by index (``r0``, ``r1``, ... in creation order) and the router's view of them."""

    def __init__(self, cfg: ClusterConfig, trace_bs: int = 16, prefix_hashes: bool = False, seed: int = 0,
                 trace: pa.Table | None = None) -> None:
        self.cfg = cfg
        self.seed = seed      # the run's: engine schedulers and speculative acceptance draws follow it
        self.pools = {p.name: p for p in cfg.pools}
        self._costs = {name: cost_model(p, cfg.catalogs, cfg.moe_spec) for name, p in self.pools.items()}
        self._spec = {name: speculation(p, self._costs[name], cfg.catalogs, trace, seed)
                      for name, p in self.pools.items()}
        self._units = {name: (prefix_unit(p, trace_bs) if p.enable_prefix_caching and prefix_hashes
                              and p.role != "decode" else (0, 1)) for name, p in self.pools.items()}
        self._lora = {name: lora_costs(p.max_loras, p.max_cpu_loras, p.lora_rank, p.lora_adapter_mib,
                                       p.lora_fetch_gb_s, self._costs[name]) for name, p in self.pools.items()}
        self._reference = decode_capacity(next(iter(self._costs.values())))
        caching = any(u[0] for u in self._units.values())
        self.replicas: list[Replica] = []
        self.view = View(targets=[], block_size=trace_bs, cached_prefix=self.cached_prefix if caching else None)
        #: called with each replica added after the start (results and series follow the fleet)
        self.on_add: list[Callable[[Replica], None]] = []
        for p in self.pools.values():
            for _ in range(p.replicas):
                self.add(p.name, 0.0)

    def add(self, pool_name: str, now: float, starting: bool = False) -> Replica:
        p = self.pools[pool_name]
        i = len(self.replicas)
        unit, stride = self._units[pool_name]
        cost = self._costs[pool_name]
        rep = Replica(i, f"r{i}", cost, max_num_seqs=p.max_num_seqs,
                      max_num_batched_tokens=p.max_num_batched_tokens, block_size=p.block_size,
                      chunked_prefill=p.chunked_prefill, prefix_unit_blocks=unit, pool=p.name, role=p.role,
                      scheduler=make_engine_scheduler(self.cfg.scheduler, self.cfg.scheduler_args, self.seed),
                      context_limit=p.max_model_len or p.model_spec(self.cfg.catalogs).max_context,
                      hash_stride=stride, created_at=now,
                      swap_blocks=cost.swap_blocks(p.swap_space_gib) if p.preemption == "swap" else 0,
                      speculation=self._spec[pool_name], lora=self._lora[pool_name],
                      jitter=self._jitter(cost, i))
        rep.starting = starting
        rep.t = now
        self.replicas.append(rep)
        # adapters: the replica's own books (exact), or, when signals are scraped, what the last scrape read
        add_target(self.view, TargetInfo(name=rep.name, pool=p.name, gpu=p.gpu,
                                         capacity=decode_capacity(rep.cost) / self._reference),
                   healthy=rep.routable, now=now,
                   adapters=rep.lora if rep.lora is None or not self.cfg.signal_refresh_s else rep.lora.snapshot())
        for hook in self.on_add:
            hook(rep)
        return rep

    def _jitter(self, cost: CostModel | ProfileCost, index: int) -> StepJitter | None:
        """Replica ``index``'s step-time jitter draws: from its profile's measured spread, unless the
        cluster turns jitter off (sim/jitter.py)."""
        if not self.cfg.jitter or not isinstance(cost, ProfileCost) or not cost.profile.jitter.active:
            return None
        return StepJitter(cost.profile.jitter, self.seed, index)

    def expert_loads(self) -> dict[str, ExpertLoad]:
        """The MoE pools' expert-load states, by pool name."""
        return {name: c.expert_load for name, c in self._costs.items() if c.expert_load is not None}

    def clocks(self) -> dict[str, float]:
        """Each roofline pool's SM clock (a fraction of the maximum; sim/cost.py ``set_clock``)."""
        return {name: c.gpu_clock for name, c in self._costs.items() if isinstance(c, CostModel)}

    def set_clock(self, pool: str, clock: float) -> None:
        """Set a pool's SM clock (its power cap kept), for the green controller (sim/green.py)."""
        cost = self._costs.get(pool)
        if not isinstance(cost, CostModel):
            raise UserError(f"green controller set the clock of {pool!r}, not a roofline pool "
                            f"(pools: {', '.join(self.clocks())})", "cluster.green")
        cost.set_clock(clock, cost.power_cap_w)
        for rep in self.replicas:
            if rep.pool == pool:
                rep.cost_changed()

    def refresh_health(self, rep: Replica) -> None:
        put(self.view, "healthy", rep.index, rep.routable)

    def status(self) -> dict[str, PoolStatus]:
        """Each pool's ready, starting and draining replicas (retired ones are gone)."""
        out = {}
        for name in self.pools:
            members = [r for r in self.replicas if r.pool == name and r.retired_at is None]
            out[name] = PoolStatus(name=name,
                                   ready=tuple(r.index for r in members if not (r.starting or r.draining)),
                                   starting=tuple(r.index for r in members if r.starting),
                                   draining=tuple(r.index for r in members if r.draining))
        return out

    def cached_prefix(self, i: int, hashes: Sequence[int]) -> int:
        """Leading trace blocks of ``hashes`` that replica ``i`` holds (``View.cached_prefix``)."""
        rep = self.replicas[i]
        if rep.kv.cache is None:
            return 0
        stride = rep.hash_stride
        units = rep.kv.cache.resident(hashes if stride == 1 else hashes[stride - 1::stride])
        return min(units * stride, len(hashes))

    def gpu_hours_and_cost(self, end: float) -> tuple[float, float]:
        """GPU-hours and on-demand dollars of every replica from its creation to its retirement (or ``end``)."""
        hours = cost = 0.0
        for r in self.replicas:
            h = r.cost.gpus * (min(end, r.retired_at if r.retired_at is not None else end) - r.created_at) / 3600.0
            hours += h
            cost += h * r.cost.gpu.price_per_hour
        return hours, cost
