"""Train a routing policy without a GPU: the cross-entropy method over whole simulated runs.

A candidate is a weight vector of the learned policy's scorer (:mod:`llmlb_bench.policies.learned`:
linear, or a small tanh MLP, over the features of :mod:`llmlb_bench.policies.features`). Its
fitness is the objective of complete simulations of the training traces, routed by that very
policy through the same simulator as ``llmlb simulate`` (:func:`llmlb_bench.sim.simulate`), so
nothing is learned from a surrogate: queueing, batching, prefix caches and stale signals are in
the number being maximised. The cross-entropy method (Rubinstein 1999; de Boer et al. 2005)
suits this: the fitness is a black box with few parameters (tens), one run's return is
known only at its end (credit assignment per decision is what RL would need gradients for),
and it parallelises over candidates. Each generation draws ``population`` vectors from a
diagonal Gaussian, keeps the ``elite`` best, and refits the mean and spread to them (with a
floor on the spread so the search does not collapse early); the best vector ever seen wins.

Determinism: candidates come from ``numpy.random.default_rng(seed)`` and every simulation is
seeded, so the same inputs and seed give the same file whatever ``workers`` is.

Training and evaluation are apart by construction: traces generated from a spec for training
use seeds ``TRAIN_SEED_BASE + k`` (see :func:`train_seeds`); evaluation seeds must lie below it
(:func:`check_eval_seeds`), and the policy file records the training seeds it saw.
"""

from __future__ import annotations

import hashlib
import json
import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.learn.rewards import Ended, Reward, zero_costs
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.policies.base import Policy
from llmlb_bench.policies.features import Features, Layout
from llmlb_bench.policies.learned import LearnedPolicy, Layers, PolicyDoc, n_params, policy_document, unflatten
from llmlb_bench.policies.predictor import Predictor, load_predictor
from llmlb_bench.schema import REQUESTS
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store.sink import rows_table

if TYPE_CHECKING:
    from llmlb_bench.workload import WorkloadSpec

#: training traces generated from a spec use seeds from here up; evaluation seeds stay below
TRAIN_SEED_BASE = 1_000_000
Vector = npt.NDArray[np.float64]


def train_seeds(seed: int, n: int) -> list[int]:
    """The workload seeds of ``n`` training traces for training seed ``seed`` (never evaluation seeds)."""
    if seed < 0:
        raise UserError(f"must be >= 0, got {seed}", "--seed")
    return [TRAIN_SEED_BASE + seed * 1000 + k for k in range(n)]


def check_eval_seeds(seeds: Sequence[int], where: str, trained_on: Sequence[int] = ()) -> None:
    """Evaluation seeds must be below :data:`TRAIN_SEED_BASE` and not among ``trained_on``."""
    for s in seeds:
        if s >= TRAIN_SEED_BASE or s in trained_on:
            raise UserError(f"evaluation seed {s} is a training seed (training uses {TRAIN_SEED_BASE} and up)", where)


# ---- run outcomes ---------------------------------------------------------------------------------

_COLUMNS = ("slo_class", "tenant", "scheduled_s", "first_token_s", "last_token_s", "output_tokens", "status")


class _Collect:
    """An in-memory requests sink: only the columns the objectives read, no files."""

    def __init__(self) -> None:
        self.parts: list[pa.Table] = []

    def write(self, columns: Mapping[str, Sequence[object] | pa.Array]) -> None:
        table = rows_table(REQUESTS, columns, {"run_id": ""})
        if table is not None:
            self.parts.append(table.select(list(_COLUMNS)))


class _Discard:
    def write(self, columns: Mapping[str, Sequence[object] | pa.Array]) -> None:
        return None


class _MemoryRun:
    """What :func:`simulate` writes into: requests kept in memory, series dropped."""

    def __init__(self) -> None:
        self.requests = _Collect()
        self.series = _Discard()


@dataclass(frozen=True)
class RunOutcome:
    """Per-request figures of one simulated run (numpy; latencies NaN where a request has none)."""

    ttft: Vector
    tpot: Vector
    e2e: Vector
    status: list[str]
    output_tokens: npt.NDArray[np.int64]
    slo_class: list[str]
    tenant: list[str]
    energy_j: float

    def ended(self) -> Iterator[Ended]:
        """Each request as the environment's rewards see it (learn/rewards.py)."""
        for i, st in enumerate(self.status):
            ttft = float(self.ttft[i])
            tpot = float(self.tpot[i])
            yield Ended(st, self.slo_class[i], self.tenant[i], None if math.isnan(ttft) else ttft,
                        float(self.e2e[i]), 0.0 if math.isnan(tpot) else tpot, int(self.output_tokens[i]))


def simulate_outcome(trace: pa.Table, cluster: ClusterConfig, policy: Policy, seed: int) -> RunOutcome:
    """Simulate ``trace`` under ``policy`` in memory (no results folder) and return what objectives read."""
    run = _MemoryRun()
    summary = simulate(trace, cluster, policy, run, seed=seed)
    t = pa.concat_tables(run.requests.parts)

    def col(name: str) -> Vector:
        return np.asarray(t.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)

    sched, first, last, out = col("scheduled_s"), col("first_token_s"), col("last_token_s"), col("output_tokens")
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (last - first) / (out - 1), np.nan)
    return RunOutcome(ttft=first - sched, tpot=tpot, e2e=last - sched, status=t.column("status").to_pylist(),
                      output_tokens=np.nan_to_num(out).astype(np.int64),
                      slo_class=[str(c) for c in t.column("slo_class").to_pylist()],
                      tenant=[str(c) for c in t.column("tenant").to_pylist()],
                      energy_j=float(summary.get("energy_j") or 0.0))


# ---- the objective --------------------------------------------------------------------------------

def fitness(outcome: RunOutcome, reward: Reward) -> float:
    """A run's objective: the mean per-request reward over every request of the trace (failures and
    refusals included) plus the episode terms (learn/rewards.py: one definition for the environment
    and this trainer). ``slo_met`` alone is the run's SLO attainment."""
    reward.reset()
    cost = zero_costs()
    total = sum(reward.ended(e, cost) for e in outcome.ended())
    n = max(len(outcome.status), 1)
    return total / n + reward.episode_reward(outcome.energy_j)


def check_search(population: int, elite: int) -> None:
    """The cross-entropy method needs 1 <= elite < population."""
    if not 1 <= elite < population:
        raise UserError(f"elite must be between 1 and population - 1 (population {population}, elite {elite})",
                        "--elite")


# ---- the search ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Problem:
    """Everything a fitness evaluation needs; picklable, so pool workers get it once."""

    traces: tuple[pa.Table, ...]
    cluster: ClusterConfig
    layout: Layout
    hidden: tuple[int, ...]
    objective: str
    slo: Slo | None
    sim_seed: int
    #: a length predictor file for the predicted_output feature ("" = none); a path, so workers load it
    predictor: str = ""

    @property
    def n_in(self) -> int:
        return len(self.layout["per_target"]) + len(self.layout["per_request"])

    def policy(self, vector: Vector) -> LearnedPolicy:
        feats = Features.from_layout(self.layout, predictor=load_predictor(self.predictor) if self.predictor else None)
        return LearnedPolicy.from_model(unflatten(vector, self.n_in, self.hidden), feats)

    def fitness(self, vector: Vector) -> float:
        """Mean objective over the training traces of the policy with these weights."""
        reward = Reward.parse(self.objective, self.slo, where="--objective")
        values = [fitness(simulate_outcome(t, self.cluster, self.policy(vector), self.sim_seed + k), reward)
                  for k, t in enumerate(self.traces)]
        return float(np.mean(values))


def active_mask(problem: Problem) -> npt.NDArray[np.bool_]:
    """Which parameters can change a decision. In a linear scorer the request's features and the
    bias add the same to every target's score, so only the per-target weights are searched."""
    n = n_params(problem.n_in, problem.hidden)
    if problem.hidden:
        return np.ones(n, dtype=bool)
    mask = np.zeros(n, dtype=bool)
    mask[:len(problem.layout["per_target"])] = True
    return mask


def start_vector(problem: Problem) -> Vector:
    """Where the search starts: join the shortest queue (weight -1 on the own in-flight count) for a
    linear scorer that has that feature, so candidate 0 is a known-good heuristic and the best ever
    kept is never worse than it on the training traces; else all zeros (every target scores alike:
    ties rotate, i.e. round robin)."""
    v = np.zeros(n_params(problem.n_in, problem.hidden))
    names = [f["name"] for f in problem.layout["per_target"]]
    if not problem.hidden and "outstanding_requests" in names:
        v[names.index("outstanding_requests")] = -1.0
    return v


_WORKER: Problem | None = None


def _init_worker(problem: Problem) -> None:
    global _WORKER
    _WORKER = problem


def _worker_fitness(vector: Vector) -> float:
    assert _WORKER is not None
    return _WORKER.fitness(vector)


@dataclass
class Generation:
    """One generation's figures, as progress reports them."""

    index: int
    best: float          # best fitness of this generation
    mean: float          # mean fitness of its population
    best_ever: float
    spread: float        # mean standard deviation of the sampling distribution after the update


@dataclass
class Result:
    vector: Vector
    fitness: float
    history: list[Generation] = field(default_factory=list)
    evaluations: int = 0


def cem(problem: Problem, *, generations: int, population: int, elite: int, seed: int, init_std: float = 0.5,
        min_std: float = 0.05, workers: int = 1,
        progress: Callable[[Generation], None] | None = None) -> Result:
    """The cross-entropy method (see the module docstring); returns the best vector ever evaluated."""
    check_search(population, elite)
    rng = np.random.default_rng(seed)
    mask = active_mask(problem)
    n = len(mask)
    mean, std = start_vector(problem), np.where(mask, init_std, 0.0)
    best = Result(vector=np.zeros(n), fitness=-math.inf)
    pool = ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(problem,)) if workers > 1 else None
    try:
        for g in range(generations):
            cands = mean + std * rng.standard_normal((population, n))
            cands[0] = mean                  # the mean itself (generation 1: the starting point)
            scores = np.array(list(pool.map(_worker_fitness, cands)) if pool else [problem.fitness(c) for c in cands])
            best.evaluations += population
            order = np.argsort(-scores, kind="stable")
            if scores[order[0]] > best.fitness:
                best.vector, best.fitness = cands[order[0]].copy(), float(scores[order[0]])
            # elitism: the best vector ever seen is always among the elite the next mean is fitted to, so
            # a generation of bad draws cannot drag the search away from what already works
            elite_set = cands[order[:elite]].copy()
            if best.fitness > scores[order[0]]:
                elite_set[-1] = best.vector
            mean = elite_set.mean(axis=0)
            std = np.where(mask, np.maximum(elite_set.std(axis=0), min_std), 0.0)
            gen = Generation(g, float(scores[order[0]]), float(scores.mean()), best.fitness, float(std[mask].mean()))
            best.history.append(gen)
            if progress is not None:
                progress(gen)
    finally:
        if pool is not None:
            pool.shutdown()
    return best


# ---- the command's logic --------------------------------------------------------------------------

def trace_identity(source: Path | None, spec: Mapping[str, object] | None, seeds: Sequence[int],
                   traces: Sequence[pa.Table]) -> dict[str, object]:
    """What the policy was trained on: a trace file's sha256, or (generated traces) the sha256 of
    the spec and seeds that regenerate them; rows; the spec."""
    if source is not None and source.suffix == ".parquet":
        h = hashlib.sha256(source.read_bytes()).hexdigest()
    else:
        h = hashlib.sha256(json.dumps({"spec": spec, "seeds": list(seeds)}, sort_keys=True, default=str)
                           .encode()).hexdigest()
    return {"source": source.name if source is not None else None, "sha256": h,
            "rows": int(sum(t.num_rows for t in traces)), "spec": spec, "seeds": list(seeds)}


def train_policy(traces: Sequence[pa.Table], cluster: ClusterConfig, *, objective: str, slo: Slo | None,
                 identity: Mapping[str, object], seed: int, hidden: Sequence[int] = (), fields: Sequence[str] | None = None,
                 generations: int = 8, population: int = 12, elite: int = 3, workers: int = 1,
                 progress: Callable[[Generation], None] | None = None,
                 predictor: str = "") -> tuple[PolicyDoc, Result]:
    """Train and return the policy file's document (and the search's result). With ``predictor``
    (a file of ``llmlb learn predictor``) the features may include ``predicted_output``; the
    policy then runs with the same file (``-p learned --policy-arg predictor=FILE``)."""
    Reward.parse(objective, slo, where="--objective")
    check_search(population, elite)
    if any(h < 1 for h in hidden):
        raise UserError("hidden layer widths must be >= 1", "--hidden")
    classes = sorted({str(c) for t in traces for c in t.column("slo_class").unique().to_pylist()} - {"default"})
    length = load_predictor(predictor) if predictor else None
    layout = Features(fields=fields, slo_classes=classes if hidden else (), predictor=length,
                      where="--fields").layout()
    problem = Problem(tuple(traces), cluster, layout, tuple(hidden), objective, slo, seed, predictor)
    result = cem(problem, generations=generations, population=population, elite=elite, seed=seed,
                 workers=workers, progress=progress)
    layers: Layers = unflatten(result.vector, problem.n_in, problem.hidden)
    doc = policy_document(layout, layers,
                          objective={"name": objective, "slo": slo.describe() if slo else None,
                                     "train_fitness": result.fitness},
                          training={"trace": dict(identity), "seed": seed, "cluster": cluster.to_dict(),
                                    "predictor": _predictor_identity(predictor, length),
                                    "trainer": {"method": "cem", "generations": generations,
                                                "population": population, "elite": elite,
                                                "evaluations": result.evaluations},
                                    "history": [vars(g) for g in result.history]})
    return doc, result


def _predictor_identity(path: str, length: Predictor | None) -> dict[str, object] | None:
    """The length predictor a policy was trained with (file name, sha256, its training), or None."""
    if length is None:
        return None
    from llmlb_bench.store.run import file_sha256
    return {"file": Path(path).name, "sha256": file_sha256(path), "training": length.doc.get("training", {})}


def write_policy(doc: Mapping[str, object], path: Path) -> None:
    """Write the policy file whole (a temporary file renamed over it: never half-written)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def generated_trace(spec: WorkloadSpec, seed: int, requests: int | None = None) -> pa.Table:
    """The trace ``llmlb run`` would simulate for workload ``spec`` (a WorkloadSpec) at ``seed``: written
    and read back through the trace file format, so its metadata (spec, block size) is the same."""
    import tempfile

    from llmlb_bench.schema import read_trace, write_trace
    from llmlb_bench.workload import generate

    workload = spec.replace(seed=seed, **({"requests": requests} if requests else {}))
    with tempfile.TemporaryDirectory(prefix="llmlb-learn-") as tmp:
        path = Path(tmp) / "trace.parquet"
        write_trace(generate(workload), path, spec=workload.to_dict(), block_size=workload.block_size)
        return read_trace(path)
