"""Expert-load imbalance of MoE models under expert parallelism, and EPLB rebalancing.

A MoE layer's routed experts are spread over the replica's ``ep`` GPUs (expert
parallelism over the tensor-parallel group, as vLLM's ``--enable-expert-parallel``
does; ``ep = tp``). Each token is routed to ``k`` of ``E`` experts, expert ``e``
with probability ``p_e`` (its popularity). In a step of ``T`` tokens, the
``T k`` routed token-slots fall on GPU ``g`` with probability ``P_g`` = the
popularity of the expert replicas it holds, so its load is multinomial
(the ``k`` choices of one token are drawn independently here; routers pick
``k`` distinct experts, which matters little when ``E >> k``). The layer waits
for the busiest GPU, so the routed-expert compute of the step is the balanced
one times

    f(T) = E[max_g X_g] / (T k / ep),    X ~ Multinomial(T k, P),

which tends to ``ep x max_g P_g`` as ``T`` grows (the closed form for large
batches) and is larger for small ``T`` (sampling noise). ``f`` is tabulated by
Monte Carlo (seeded, so runs are deterministic) at T = 1, 2, 4, ... and
interpolated linearly between; it multiplies only the routed experts' FLOPs,
so it matters in compute-bound (prefill-heavy) steps and hardly in
memory-bound decode steps.

Popularity: ``zipf`` (``p`` proportional to rank^-``zipf_s``; ``zipf_s = 0`` is
uniform) or ``dirichlet`` (``p ~ Dirichlet(alpha)``; small ``alpha`` = skewed),
assigned to experts by a seeded random permutation. Experts sit on GPUs in
contiguous blocks (expert ``e`` on GPU ``e x ep / E``), vLLM's default layout.
With ``drift_s`` > 0 the popularity is redrawn every ``drift_s`` seconds: hot
experts move, as they do when the traffic mix changes.

EPLB (DeepSeek's Expert-Parallelism Load Balancer, github.com/deepseek-ai/EPLB):
every ``eplb_interval_s`` seconds the layout is rebuilt from the current
popularity (the load statistics of the last period, taken as exact) with
``redundant_experts`` extra slots: (1) each extra slot replicates the expert with
the most load per replica; (2) the E + R replicas, each carrying its expert's
load / replicas, are packed onto the GPUs, (E + R) / ep slots each, heaviest
first onto the least loaded GPU with a free slot. A replicated expert's tokens
split evenly over its replicas. The redundant replicas cost memory: each GPU
holds (E + R) / ep experts' weights instead of E / ep (fewer KV blocks, more
bytes read per step; see :class:`~llmlb_bench.sim.cost.CostModel`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import construct, unknown_choice

POPULARITIES = ("zipf", "dirichlet")
#: the factor table: T = 2^0 .. 2^MAX_LOG2 tokens per step (larger steps use the last entry)
MAX_LOG2 = 15
#: Monte Carlo draws per table entry
DRAWS = 256


@dataclass(frozen=True)
class MoeSpec:
    """``ClusterConfig.moe``: how skewed expert popularity is and how EPLB counters it."""

    popularity: str = "zipf"
    zipf_s: float = 1.0
    alpha: float = 1.0
    drift_s: float = 0.0
    eplb_interval_s: float = 0.0
    redundant_experts: int = 0
    seed: int = 0

    @classmethod
    def parse(cls, raw: Mapping[str, object], where: str = "cluster.moe") -> "MoeSpec":
        fields = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(raw) - fields)
        if unknown:
            raise unknown_choice("setting", unknown[0], sorted(fields), where)
        spec = construct(cls, raw)   # each value checked below
        if spec.popularity not in POPULARITIES:
            raise UserError(f"popularity must be one of {', '.join(POPULARITIES)}, got {spec.popularity!r}",
                            f"{where}.popularity")
        for name in ("zipf_s", "drift_s", "eplb_interval_s"):
            value = getattr(spec, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise UserError(f"must be a number >= 0, got {value!r}", f"{where}.{name}")
        if isinstance(spec.alpha, bool) or not isinstance(spec.alpha, (int, float)) or spec.alpha <= 0:
            raise UserError(f"must be a number > 0, got {spec.alpha!r}", f"{where}.alpha")
        for name in ("redundant_experts", "seed"):
            value = getattr(spec, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"must be an integer >= 0, got {value!r}", f"{where}.{name}")
        if spec.redundant_experts and not spec.eplb_interval_s:
            raise UserError("redundant experts are placed by EPLB: set eplb_interval_s > 0", where)
        return spec


def zipf_weights(experts: int, s: float) -> np.ndarray:
    """Popularity of ranks 1..E: proportional to rank^-s, summing to 1."""
    w = np.arange(1, experts + 1, dtype=np.float64) ** -float(s)
    out: np.ndarray = w / w.sum()
    return out


def eplb_layout(load: np.ndarray, gpus: int, redundant: int) -> list[list[int]]:
    """EPLB's replicate-then-pack: the experts whose replicas each GPU holds."""
    experts = len(load)
    count = np.ones(experts, dtype=np.int64)
    for _ in range(redundant):
        count[int(np.argmax(load / count))] += 1
    replicas = sorted(((load[e] / count[e], e) for e in range(experts) for _ in range(count[e])),
                      key=lambda r: (-r[0], r[1]))
    slots = (experts + redundant) // gpus
    gpu_load = [0.0] * gpus
    layout: list[list[int]] = [[] for _ in range(gpus)]
    for share, e in replicas:
        g = min((i for i in range(gpus) if len(layout[i]) < slots), key=lambda i: (gpu_load[i], i))
        layout[g].append(e)
        gpu_load[g] += share
    return layout


def contiguous_layout(experts: int, gpus: int) -> list[list[int]]:
    """Expert e on GPU e x gpus / E, no replicas."""
    layout: list[list[int]] = [[] for _ in range(gpus)]
    for e in range(experts):
        layout[e * gpus // experts].append(e)
    return layout


def gpu_shares(layout: list[list[int]], popularity: np.ndarray) -> np.ndarray:
    """Each GPU's share of routed tokens: its replicas' popularity, a replicated expert's split evenly."""
    count = np.bincount([e for gpu in layout for e in gpu], minlength=len(popularity))
    return np.array([sum(popularity[e] / count[e] for e in gpu) for gpu in layout])


def imbalance_table(gpu_share: np.ndarray, routed_per_token: int, rng: np.random.Generator) -> list[float]:
    """f(T) at T = 2^0 .. 2^MAX_LOG2: mean busiest-GPU load over the balanced load (Monte Carlo)."""
    gpus = len(gpu_share)
    p = gpu_share / gpu_share.sum()
    out = []
    for j in range(MAX_LOG2 + 1):
        slots = (1 << j) * routed_per_token
        busiest = rng.multinomial(slots, p, size=DRAWS).max(axis=1).mean()
        out.append(float(busiest) / (slots / gpus))
    return out


def check_layout(spec: MoeSpec, experts: int, ep: int, where: str = "cluster.moe") -> None:
    """The model must be a MoE whose experts (with EPLB's redundant ones) split evenly over ``ep`` GPUs."""
    if experts < 2:
        raise UserError("expert-load imbalance needs a MoE model (experts > 1)", where)
    if (experts + spec.redundant_experts) % ep:
        raise UserError(f"experts + redundant_experts ({experts} + {spec.redundant_experts}) must split evenly "
                        f"over the {ep} GPUs of a replica (tp)", where)


class ExpertLoad:
    """The expert-load state of one pool's replicas: its current slowdown table and its changes over time."""

    def __init__(self, spec: MoeSpec, experts: int, active: int, ep: int, where: str = "cluster.moe") -> None:
        check_layout(spec, experts, ep, where)
        self.spec, self.experts, self.active, self.ep = spec, experts, active, ep
        self._rng = np.random.default_rng(spec.seed)
        self.popularity = self._draw()
        self.layout = contiguous_layout(experts, ep)
        self._next_drift = spec.drift_s if spec.drift_s > 0 else math.inf
        self._next_eplb = spec.eplb_interval_s if spec.eplb_interval_s > 0 else math.inf
        #: (time, large-batch slowdown ep x max_g P_g) at the start and after every change
        self.history: list[tuple[float, float]] = []
        self._tabulate(0.0)

    @property
    def next_change(self) -> float:
        return min(self._next_drift, self._next_eplb)

    @property
    def limit(self) -> float:
        """The current slowdown for large batches: ep x the busiest GPU's share of routed tokens."""
        return self.history[-1][1]

    def _draw(self) -> np.ndarray:
        s = self.spec
        if s.popularity == "zipf":
            weights = zipf_weights(self.experts, s.zipf_s)
        else:
            weights = self._rng.dirichlet(np.full(self.experts, float(s.alpha)))
        return weights[self._rng.permutation(self.experts)]

    def _tabulate(self, t: float) -> None:
        share = gpu_shares(self.layout, self.popularity)
        self._table = imbalance_table(share, self.active, self._rng)
        self.history.append((t, float(self.ep * share.max() / share.sum())))

    def advance(self, t: float) -> None:
        """Apply the popularity drifts and EPLB rebalances due at ``t`` (called by the simulation)."""
        changed = False
        if self._next_drift <= t:
            self.popularity = self._draw()     # experts keep their places; their loads change
            self._next_drift += self.spec.drift_s
            changed = True
        if self._next_eplb <= t:
            self.layout = eplb_layout(self.popularity, self.ep, self.spec.redundant_experts)
            self._next_eplb += self.spec.eplb_interval_s
            changed = True
        if changed:
            self._tabulate(t)

    def factor(self, tokens: int) -> float:
        """f(tokens): the routed-expert compute of a step of ``tokens`` tokens over the balanced one."""
        table = self._table
        if tokens <= 1:
            return table[0]
        j = tokens.bit_length() - 1
        if j >= MAX_LOG2:
            return table[MAX_LOG2]
        lo = 1 << j
        return table[j] + (table[j + 1] - table[j]) * (tokens - lo) / lo
