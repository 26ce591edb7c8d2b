"""The learning benchmark: standard tasks on which heuristics, the bandit and a trained policy meet.

A task (a table of ``tasks/learning.toml``) names a workload spec, a cluster, an SLO, the
objective the trained policy maximises, and the built-in heuristics that are relevant to it.
:func:`run_task` then

1. trains a policy for the task (:mod:`llmlb_bench.learn.train`) on traces generated with
   training seeds (1000000 and up);
2. generates one evaluation trace per evaluation seed (below 1000000: never a training trace;
   checked against the seeds the policy file records) and simulates every heuristic, the
   bandit and the trained policy on each, storing ordinary runs (``llmlb report`` reads them);
3. compares them with the gate's statistics (:func:`llmlb_bench.gate.decide.relative_change`):
   the runs of one seed share a trace, so each comparison is a paired t-test over the seeds'
   log changes, with a 95% interval; the p-values of a task's comparisons are Holm-adjusted
   together. A comparison is a *win* or a *loss* when its adjusted p-value is below 0.05, else
   a *tie*.

Each figure's interval across seeds is a t-interval of the per-run values.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypedDict

import numpy as np

from llmlb_bench.errors import UserError
from llmlb_bench.learn.rewards import Reward
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.sim import ClusterConfig, load_cluster
from llmlb_bench.tomlfile import check_fields, read_toml
from llmlb_bench.workload import generate, load_spec
from llmlb_bench.workload.spec import WorkloadSpec

if TYPE_CHECKING:
    from llmlb_bench.gate.samples import RunSample

#: figures each policy is measured on, and whether higher is better
FIGURES: dict[str, bool] = {"attainment": True, "mean_ttft": False, "p99_ttft": False, "mean_e2e": False}
#: figures on which the learning policies are compared with the best heuristic
COMPARED = ("attainment", "mean_ttft", "p99_ttft")
_TASK_FIELDS = ("description", "workload", "requests", "rate_scale", "cluster", "cluster_file", "slo", "objective",
                "heuristics", "bandit", "train")
_TRAIN_FIELDS = ("traces", "requests", "generations", "population", "elite", "hidden", "fields")


class Interval(TypedDict):
    """A figure's mean over seeds and its 95% t-interval (None where too few seeds have it)."""

    mean: float | None
    low: float | None
    high: float | None


class SeedFigure(Interval):
    per_seed: list[float | None]


class _Decided(TypedDict, total=False):
    p_holm: float        # where the test has a p-value
    verdict: str         # win | loss | tie, set on every row before compare returns


class Comparison(_Decided):
    """A learning policy against the best heuristic on one figure (the gate's statistics)."""

    candidate: str
    baseline: str
    figure: str
    baseline_value: float | None
    candidate_value: float | None
    change: float | None
    low: float | None
    high: float | None
    p_value: float | None
    design: str


class PolicyEntry(TypedDict):
    policy: str
    args: dict[str, object]


class TrainRecord(TypedDict):
    fitness: float
    evaluations: int
    wall_s: float
    generations: list[dict[str, object]]
    policy_file: str


class TaskRecord(TypedDict):
    """One task's outcome (:func:`run_task`), as results.json lists it and :func:`markdown` reports it."""

    task: str
    description: str
    workload: str
    requests: int
    cluster: dict[str, object]
    slo: str
    objective: str
    eval_seeds: list[int]
    train_seeds: list[int]
    policies: dict[str, PolicyEntry]
    train: TrainRecord
    eval_wall_s: float
    figures: dict[str, dict[str, SeedFigure]]
    best_heuristic: str
    comparisons: list[Comparison]


@dataclass(frozen=True)
class Entry:
    """One compared policy: its label in the report, registry name and arguments."""

    label: str
    policy: str
    args: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    workload: WorkloadSpec
    workload_path: Path
    requests: int
    cluster: ClusterConfig
    slo: Slo
    objective: str
    heuristics: tuple[Entry, ...]
    bandit: Entry
    train: Mapping[str, Any]     # the task file's [train] table, read where it is used

    def trace_spec(self, seed: int, requests: int | None = None) -> WorkloadSpec:
        return self.workload.replace(seed=seed, requests=requests or self.requests)


def _entry(raw: object, where: str) -> Entry:
    if isinstance(raw, str):
        return Entry(raw, raw)
    if isinstance(raw, Mapping) and isinstance(raw.get("policy"), str):
        check_fields(raw, ("policy", "args", "label"), where)
        args = dict(raw.get("args") or {})
        return Entry(str(raw.get("label") or raw["policy"]), raw["policy"], args)
    raise UserError("a heuristic is a policy name or {policy = ..., args = {...}, label = ...}", where)


def load_tasks(path: Path, only: Sequence[str] = ()) -> list[Task]:
    """Read and check every task of ``path`` (workloads, clusters, SLOs, objectives, policies and
    their arguments) before anything runs; ``only``: these task names, in this order."""
    from llmlb_bench.policies import make_policy

    raw = read_toml(path, "learning tasks file (.toml)")
    check_fields(raw, ("tasks",), path)
    tables = raw.get("tasks")
    if not isinstance(tables, Mapping) or not tables:
        raise UserError("has no [tasks.NAME] tables", path)
    for name in only:
        if name not in tables:
            raise UserError(f"no task {name!r} (tasks: {', '.join(tables)})", "--task")
    tasks = []
    for name in only or list(tables):
        t = tables[name]
        where = f"{path} [tasks.{name}]"
        check_fields(t, _TASK_FIELDS, where)
        workload_path = (path.parent / str(t.get("workload", ""))).resolve()
        spec = load_spec(workload_path)
        if "rate_scale" in t:
            spec = spec.replace(rate_scale=float(t["rate_scale"]) * spec.rate_scale)
        overrides = dict(t.get("cluster") or {})
        cluster = (load_cluster(path.parent / str(t["cluster_file"]), overrides) if "cluster_file" in t
                   else ClusterConfig.from_dict(overrides))
        slo = Slo.parse(str(t.get("slo", "")), where)
        assert slo is not None
        objective = str(t.get("objective", "slo_met"))
        Reward.parse(objective, slo, where=where)
        train = dict(t.get("train") or {})
        check_fields(train, _TRAIN_FIELDS, f"{where} train")
        heuristics = tuple(_entry(h, where) for h in t.get("heuristics") or [])
        if not heuristics:
            raise UserError("names no heuristics to compare with", where)
        bandit = Entry("bandit", "bandit", dict(t.get("bandit") or {}))
        for e in heuristics + (bandit,):
            make_policy(e.policy, e.args)
        labels = [e.label for e in heuristics] + ["bandit", "learned"]
        if len(set(labels)) != len(labels):
            raise UserError("two compared policies share a label", where)
        tasks.append(Task(name, str(t.get("description", "")), spec, workload_path, int(t.get("requests", 1000)),
                          cluster, slo, objective, heuristics, bandit, train))
    return tasks


# ---- figures and comparisons ------------------------------------------------------------------------

def _interval(values: Sequence[float]) -> Interval:
    """Mean and 95% t-interval over seeds (None where a run has no value)."""
    from scipy import stats

    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) == 0:
        return {"mean": None, "low": None, "high": None}
    if len(v) == 1:
        return {"mean": float(v[0]), "low": None, "high": None}
    half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return {"mean": float(v.mean()), "low": float(v.mean() - half), "high": float(v.mean() + half)}


def summarise(samples: Mapping[str, list[RunSample]]) -> dict[str, dict[str, SeedFigure]]:
    """label -> figure -> {mean, low, high, per_seed}."""
    from llmlb_bench.gate.decide import estimate
    from llmlb_bench.gate.rules import METRICS

    out: dict[str, dict[str, SeedFigure]] = {}
    for label, runs in samples.items():
        out[label] = {}
        for fig in FIGURES:
            per = [estimate(METRICS[fig], [r]) for r in runs]
            out[label][fig] = {**_interval([p for p in per if p is not None]), "per_seed": per}
    return out


def best_heuristic(figures: Mapping[str, Mapping[str, SeedFigure]], heuristics: Sequence[str]) -> str:
    """The heuristic with the highest mean attainment (ties: the lower mean TTFT)."""
    def key(label: str) -> tuple[float, float]:
        f = figures[label]
        return (f["attainment"]["mean"] or 0.0, -(f["mean_ttft"]["mean"] or math.inf))
    return max(heuristics, key=key)


def compare(samples: Mapping[str, list[RunSample]], base: str, candidates: Sequence[str]) -> list[Comparison]:
    """Each candidate against ``base`` on :data:`COMPARED`, Holm-adjusted together."""
    from llmlb_bench.gate.decide import holm, relative_change

    rows: list[Comparison] = []
    for cand in candidates:
        for fig in COMPARED:
            c = relative_change(fig, samples[base], samples[cand], confidence=0.95)
            rows.append({"candidate": cand, "baseline": base, "figure": fig, "baseline_value": c.baseline,
                         "candidate_value": c.candidate, "change": c.change, "low": c.low, "high": c.high,
                         "p_value": c.p_value, "design": c.design})
    ps = [r["p_value"] for r in rows]
    known = [i for i, p in enumerate(ps) if p is not None]
    adjusted: list[float] = [float(a) for a in holm([p for p in ps if p is not None])] if known else []
    for i, adj in zip(known, adjusted):
        rows[i]["p_holm"] = float(adj)
    for r in rows:
        p, change = r.get("p_holm"), r["change"]
        if p is None or change is None or p >= 0.05 or change == 0:
            r["verdict"] = "tie"
        else:
            better = change > 0 if FIGURES[r["figure"]] else change < 0
            r["verdict"] = "win" if better else "loss"
    return rows


# ---- running a task ---------------------------------------------------------------------------------

def run_task(task: Task, out: Path, results: Path, eval_seeds: Sequence[int], train_seed: int, workers: int = 1,
             say: Callable[[str], None] = lambda line: None) -> TaskRecord:
    """Train, evaluate and compare one task (see the module docstring); the policy file goes to
    ``out/<task>/policy.json``, the runs under ``results/<task>/``. Returns the task's record."""
    from llmlb_bench.experiment import simulate_run
    from llmlb_bench.gate.samples import load_side
    from llmlb_bench.learn.train import (check_eval_seeds, generated_trace, trace_identity, train_policy,
                                         train_seeds, write_policy)
    from llmlb_bench.schema import read_trace, write_trace

    tr = task.train
    seeds = train_seeds(train_seed, int(tr.get("traces", 2)))
    check_eval_seeds(eval_seeds, "--seeds", seeds)
    (out / task.name).mkdir(parents=True, exist_ok=True)
    policy_path = out / task.name / "policy.json"
    t0 = time.perf_counter()
    tables = [generated_trace(task.workload, s, int(tr.get("requests", task.requests))) for s in seeds]
    identity = trace_identity(task.workload_path, task.trace_spec(seeds[0], tr.get("requests")).to_dict(),
                              seeds, tables)
    fields = str(tr["fields"]).split(",") if tr.get("fields") else None
    doc, result = train_policy(tables, task.cluster, objective=task.objective, slo=task.slo, identity=identity,
                               seed=train_seed, hidden=tuple(tr.get("hidden", ())), fields=fields,
                               generations=int(tr.get("generations", 6)), population=int(tr.get("population", 10)),
                               elite=int(tr.get("elite", 3)), workers=workers,
                               progress=lambda g: say(f"{task.name}: generation {g.index + 1}: best "
                                                      f"{g.best:.4f}, best so far {g.best_ever:.4f}"))
    write_policy(doc, policy_path)
    train_s = time.perf_counter() - t0
    entries = list(task.heuristics) + [task.bandit, Entry("learned", "learned", {"path": str(policy_path)})]
    runs: dict[str, list[Path]] = {e.label: [] for e in entries}
    t1 = time.perf_counter()
    for s in eval_seeds:
        spec = task.trace_spec(s)
        trace_path = results / task.name / "traces" / f"seed-{s}.parquet"
        write_trace(generate(spec), trace_path, spec=spec.to_dict(), block_size=spec.block_size)
        trace = read_trace(trace_path)
        for e in entries:
            store = simulate_run(trace, trace_path, task.cluster, e.policy, e.args, s, results / task.name,
                                 label=e.label, run_id=f"{e.label}-seed{s}")
            runs[e.label].append(store.dir)
        say(f"{task.name}: seed {s}: {len(entries)} policies simulated")
    eval_s = time.perf_counter() - t1
    samples = {label: [r for rs in load_side(dirs, task.slo).values() for r in rs] for label, dirs in runs.items()}
    figures = summarise(samples)
    base = best_heuristic(figures, [e.label for e in task.heuristics])
    return {
        "task": task.name, "description": task.description, "workload": task.workload_path.name,
        "requests": task.requests, "cluster": task.cluster.to_dict(), "slo": task.slo.describe(),
        "objective": task.objective, "eval_seeds": list(eval_seeds), "train_seeds": seeds,
        "policies": {e.label: {"policy": e.policy, "args": dict(e.args)} for e in entries},
        "train": {"fitness": result.fitness, "evaluations": result.evaluations, "wall_s": train_s,
                  "generations": [vars(g) for g in result.history], "policy_file": f"{task.name}/policy.json"},
        "eval_wall_s": eval_s,
        "figures": figures, "best_heuristic": base,
        "comparisons": compare(samples, base, ["bandit", "learned"]),
    }


# ---- the report -------------------------------------------------------------------------------------

def _fmt(fig: str, v: float | None) -> str:
    if v is None:
        return "-"
    if fig == "attainment":
        return f"{100 * v:.2f}%"
    return f"{v * 1e3:,.0f} ms" if v < 1 else f"{v:,.2f} s"


def _cell(fig: str, f: Interval) -> str:
    if f["low"] is None:
        return _fmt(fig, f["mean"])
    return f"{_fmt(fig, f['mean'])} [{_fmt(fig, f['low'])}, {_fmt(fig, f['high'])}]"


def markdown(records: Sequence[TaskRecord], header: str) -> str:
    """The benchmark's report: per task, every policy's figures and the learning policies' verdicts."""
    lines = [header, "", "Verdicts against each task's best heuristic (attainment / mean TTFT / p99 TTFT):", "",
             "| task | best heuristic | its attainment | bandit | learned | learned's attainment |",
             "|---|---|---|---|---|---|"]
    for rec in records:
        verdict = {c: " / ".join(r["verdict"] for r in rec["comparisons"] if r["candidate"] == c)
                   for c in ("bandit", "learned")}
        best = rec["best_heuristic"]
        lines.append(f"| {rec['task']} | {best} | {_fmt('attainment', rec['figures'][best]['attainment']['mean'])} | "
                     f"{verdict['bandit']} | {verdict['learned']} | "
                     f"{_fmt('attainment', rec['figures']['learned']['attainment']['mean'])} |")
    lines.append("")
    for rec in records:
        lines += [f"## {rec['task']}", "", rec["description"], "",
                  f"Workload `{rec['workload']}` ({rec['requests']} requests per evaluation trace), SLO "
                  f"`{rec['slo']}`, objective `{rec['objective']}`; evaluation seeds {rec['eval_seeds']}, "
                  f"training seeds {rec['train_seeds']}. Training: {rec['train']['evaluations']} simulations, "
                  f"{rec['train']['wall_s']:.0f} s (fitness on the training traces {rec['train']['fitness']:.4f}).",
                  "", "Mean over seeds [95% t-interval]:", "",
                  "| policy | SLO attainment | mean TTFT | p99 TTFT | mean E2E |", "|---|---|---|---|---|"]
        for label, figs in rec["figures"].items():
            mark = " (best heuristic)" if label == rec["best_heuristic"] else ""
            lines.append(f"| {label}{mark} | " + " | ".join(_cell(f, figs[f]) for f in FIGURES) + " |")
        lines += ["", f"Against the best heuristic ({rec['best_heuristic']}), paired over seeds "
                      "(the gate's statistics; p Holm-adjusted over the task's comparisons):", "",
                  "| policy | figure | change [95% CI] | p (Holm) | design | verdict |", "|---|---|---|---|---|---|"]
        for c in rec["comparisons"]:
            ch = "-" if c["change"] is None else f"{100 * c['change']:+.1f}%"
            ci = "" if c["low"] is None or c["high"] is None else f" [{100 * c['low']:+.1f}%, {100 * c['high']:+.1f}%]"
            p = "-" if c.get("p_holm") is None else f"{c['p_holm']:.3g}"
            lines.append(f"| {c['candidate']} | {c['figure']} | {ch}{ci} | {p} | {c['design']} | "
                         f"**{c['verdict']}** |")
        lines.append("")
    return "\n".join(lines)
