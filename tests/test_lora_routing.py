"""LoRA-affinity routing (policies/lora.py): GIE's lora-affinity scores, and what it buys in the simulator."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.policies import RouteRequest, TargetInfo, View, make_policy
from llmlb_bench.policies.lora import LoraAffinity, adapter_score
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from llmlb_bench.workload.generate import generate
from llmlb_bench.workload.spec import WorkloadSpec
from llmlb_bench.policies.base import fill
from tests.sim_helpers import run_sim, trace


@dataclass
class Info:
    max_loras: int
    running: frozenset
    waiting: frozenset = frozenset()


def _req(adapter):
    return RouteRequest(0, 0.0, 100, 10, adapter=adapter)


def test_scores_are_gies_tiers():
    assert adapter_score("a", Info(2, frozenset({"a", "b"}))) == 1.0           # active
    assert adapter_score("a", Info(2, frozenset({"b"}))) == 0.8                # room for one more
    assert adapter_score("a", Info(2, frozenset({"b"}), frozenset({"a"}))) == 0.6   # queued there
    assert adapter_score("a", Info(2, frozenset({"b", "c"}))) == 0.0           # full
    assert adapter_score(None, Info(2, frozenset({"b"}))) == adapter_score("a", None) == 0.0


def test_affinity_first_then_a_free_slot_then_load():
    view = View([TargetInfo(f"t{i}") for i in range(3)])
    fill(view, "adapters", [Info(1, frozenset({"b"})), Info(2, frozenset({"b"})), Info(1, frozenset({"a"}))])
    fill(view, "outstanding_requests", [0, 0, 9])
    pol = make_policy("lora_affinity")
    assert pol.choose(_req("a"), view) == 2        # active beats an empty queue elsewhere
    assert pol.choose(_req("c"), view) == 1        # the only free slot
    assert pol.choose(_req(None), view) == 0       # base model: least outstanding
    fill(view, "waiting", [0, 0, 200])  # t2 over the low-queue threshold: a goes where a slot is free
    assert pol.choose(_req("a"), view) == 1
    fill(view, "healthy", [True, False, True])
    assert pol.choose(_req("c"), view) == 0


def test_lora_affinity_beats_load_only_routing_on_zipf_adapters(tmp_path):
    """GIE's claim, in the simulator: with skewed adapter popularity and few slots per replica,
    routing to where the adapter is active loads adapters less often and waits less for slots."""
    spec = WorkloadSpec.from_dict({"seed": 2, "duration_s": 40, "tenants": {"chat": {
        "arrival": {"process": "poisson", "rate": 25}, "input": {"dist": "lognormal", "median": 400, "sigma": 0.6},
        "output": {"dist": "lognormal", "median": 120, "sigma": 0.6},
        "adapters": {"count": 24, "zipf_s": 1.1}}}})
    table = generate(spec)
    cfg = ClusterConfig.build(replicas=4, gpu="a100-80g", model="llama-3-8b", max_loras=4, max_cpu_loras=8)
    out = {}
    for pol in ("least_outstanding", "lora_affinity"):
        req, _, summary = run_sim(tmp_path, table, cfg, pol, run_id=pol)
        ttft = pc.subtract(req.column("first_token_s"), req.column("scheduled_s")).to_numpy()
        out[pol] = (sum(summary["lora"]["loads"].values()), float(np.mean(ttft)), float(np.percentile(ttft, 99)))
    (loads_lo, mean_lo, p99_lo), (loads_la, mean_la, p99_la) = out["least_outstanding"], out["lora_affinity"]
    assert loads_la < 0.7 * loads_lo and mean_la < mean_lo and p99_la < p99_lo


def test_llm_d_takes_the_lora_affinity_scorer_with_a_weight():
    view = View([TargetInfo(f"t{i}") for i in range(2)])
    fill(view, "adapters", [Info(1, frozenset({"b"})), Info(1, frozenset({"a"}))])
    fill(view, "waiting", [0, 3])  # the queue scorer prefers t0 by 2 points
    assert make_policy("llm_d").choose(_req("a"), view) == 0
    assert make_policy("llm_d", {"lora_weight": 3.0}).choose(_req("a"), view) == 1     # 3 x (1.0 - 0) > 2


class _Watching(LoraAffinity):
    """lora_affinity that keeps, per request, the adapters the view showed for target 0."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, tuple] = {}

    def choose(self, req, view):
        state = view.adapters[0]
        self.seen[req.request_id] = (frozenset(state.running), frozenset(state.waiting))
        return super().choose(req, view)


def test_the_simulators_adapter_signals_are_as_stale_as_its_scrapes(tmp_path):
    t = trace(np.array([0.0, 1.0]), 100, 500, adapter=pa.array(["a1", "a2"]))
    seen = {}
    for refresh in (0.0, 10.0):
        cfg = ClusterConfig.build(replicas=1, max_loras=2, signal_refresh_s=refresh)
        pol = _Watching()
        with RunStore(tmp_path, config={}, backend="sim", run_id=f"r{refresh:g}") as run:
            simulate(t, cfg, pol, run)
        seen[refresh] = pol.seen[1]
    assert seen[0.0] == (frozenset({"a1"}), frozenset())    # a1 decodes at t = 1: seen at once
    assert seen[10.0] == (frozenset(), frozenset())         # the only scrape so far was at t = 0


def test_every_scrape_of_the_simulators_adapter_signals_reaches_the_view(tmp_path):
    """Not only the first: a request at t = 2.5 sees the scrape at t = 2, when a1 was decoding."""
    t = trace(np.array([0.0, 2.5]), 100, 500, adapter=pa.array(["a1", "a2"]))
    cfg = ClusterConfig.build(replicas=1, max_loras=2, signal_refresh_s=1.0)
    pol = _Watching()
    with RunStore(tmp_path, config={}, backend="sim", run_id="r1") as run:
        simulate(t, cfg, pol, run)
    assert pol.seen[0] == (frozenset(), frozenset())
    assert pol.seen[1] == (frozenset({"a1"}), frozenset())
