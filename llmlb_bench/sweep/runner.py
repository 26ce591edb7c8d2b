"""Run a sweep: capacity searches first (when asked), then the grid, then curves.

Everything lands in ``<results>/<sweep name>/``: one run folder per cell
(``llmlb report`` / ``llmlb query`` read them like any other runs), the
shared traces in ``traces/``, the sweep file as read in ``sweep.json``, and
the outcome (capacities, curves, knees) in ``summary.json``. The order of
phases matters only for offered-load grids, whose rates are fractions of the
reference policy's measured capacity.

Finished cells are skipped before dispatch, so a rerun after an interruption
(or a rerun to print the results again) does only the missing work.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, TypedDict

from llmlb_bench import __version__
from llmlb_bench.errors import UserError
from llmlb_bench.store.run import write_json_atomic
from llmlb_bench.sweep.capacity import CapacitySummary, CapacityTask, SeedCapacity, combine, search
from llmlb_bench.sweep.cells import TRACES, Cell, execute, finished
from llmlb_bench.sweep.curves import Curve, CurvePoint, stability_curves
from llmlb_bench.sweep.executors import Executor
from llmlb_bench.sweep.figures import Figures, cached_figures
from llmlb_bench.sweep.rates import nominal_rate
from llmlb_bench.sweep.robustness import robustness_cells
from llmlb_bench.sweep.spec import ClusterEntry, PolicyEntry, SweepSpec, WorkloadEntry

SUMMARY = "summary.json"
PLAN = "sweep.json"


class Progress(Protocol):
    """What a front end (the CLI's progress bar, a test) hears while a sweep runs."""

    def phase(self, name: str, total: int, done: int) -> None:
        """A phase starts: ``total`` tasks, of which ``done`` were already finished earlier."""

    def advance(self, ran: bool) -> None:
        """One task finished (``ran`` False when it only replayed stored runs)."""


class CapacityRow(CapacitySummary):
    """One (workload, cluster, policy)'s capacity over seeds, and what it is worth per dollar."""

    workload: str
    cluster: str
    policy: str
    price_per_hour: float
    requests_per_usd: float | None


class RobustnessCurve(TypedDict):
    """One knob's curve for a (workload, cluster, policy): its points as a stability curve's."""

    knob: str
    workload: str
    cluster: str
    policy: str
    points: list[CurvePoint]


class _SweepSummary(TypedDict):
    sweep: str
    description: str
    source: str
    tool_version: str
    slo: str | None
    seeds: list[int]
    axis: str | None
    knee_metric: str
    target: float
    capacity: list[CapacityRow]
    curves: list[Curve]


class SweepSummary(_SweepSummary, total=False):
    """summary.json: the sweep's settings and what it found (robustness curves where it has knobs)."""

    robustness: list[RobustnessCurve]


@dataclass
class SweepOutcome:
    """What one invocation did and what the sweep found."""

    root: Path
    ran: int = 0
    skipped: int = 0
    capacity: list[CapacityRow] = field(default_factory=list)
    curves: list[Curve] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)
    robustness: list[RobustnessCurve] = field(default_factory=list)

    def summary(self, spec: SweepSpec) -> SweepSummary:
        out: SweepSummary = {
            "sweep": spec.name, "description": spec.description, "source": spec.source,
            "tool_version": __version__, "slo": spec.slo_text, "seeds": list(spec.seeds),
            "axis": spec.axis, "knee_metric": spec.knee_metric,
            "target": spec.target,
            "capacity": self.capacity, "curves": self.curves,
        }
        if spec.robustness is not None:
            out["robustness"] = self.robustness
        return out


def _template(spec: SweepSpec, phase: str, w: WorkloadEntry, c: ClusterEntry, p: PolicyEntry,
              seed: int) -> Cell:
    return Cell(sweep=spec.name, phase=phase, workload=w.label, cluster=c.label, policy=p.label, axis="rate",
                x=0.0, rate_scale=1.0, rate=0.0, seed=seed, workload_spec=w.raw, workload_source=w.spec.source,
                cluster_config=c.config.to_dict(), policy_name=p.name, policy_args=dict(p.args))


def capacity_tasks(spec: SweepSpec) -> list[CapacityTask]:
    cap = spec.capacity
    assert cap is not None and spec.slo_text is not None
    tasks = []
    for w in spec.workloads:
        nominal = nominal_rate(w.spec)
        for c, p in spec.pairs():
            if p.label not in cap.policies:
                continue
            for seed in spec.seeds:
                tasks.append(CapacityTask(_template(spec, "capacity", w, c, p, seed), nominal, spec.slo_text,
                                          spec.target, cap.low, cap.high, cap.tolerance))
    return tasks


def grid_cells(spec: SweepSpec, capacity: list[CapacityRow]) -> list[Cell]:
    """Every grid cell in file order; offered-load rates come from the reference policy's capacity."""
    ref = {(r["workload"], r["cluster"]): r["mean"] for r in capacity
           if spec.capacity and r["policy"] == spec.capacity.reference}
    cells = []
    for w in spec.workloads:
        nominal = nominal_rate(w.spec)
        for c, p in spec.pairs():
            reference = ref.get((w.label, c.label))
            if spec.axis == "load" and not reference:
                raise UserError(f"no capacity of reference policy {spec.capacity.reference!r} on cluster "  # type: ignore[union-attr]
                                f"{c.label!r} for workload {w.label!r} to scale the load by (widen capacity.rate)",
                                spec.source)
            for x in spec.values:
                rate = {"rate_scale": x * nominal, "rate": x, "load": x * (reference or 0.0)}[spec.axis or ""]
                for seed in spec.seeds:
                    cells.append(replace(_template(spec, "grid", w, c, p, seed), axis=spec.axis, x=x, rate=rate,  # type: ignore[arg-type]
                                         rate_scale=rate / nominal, load=rate / reference if reference else None))
    return cells


def _capacity_phase(spec: SweepSpec, root: Path, executor: Executor, progress: Progress | None,
                    outcome: SweepOutcome) -> None:
    tasks = capacity_tasks(spec)
    if progress:
        progress.phase("capacity", len(tasks), 0)
    results: dict[int, SeedCapacity] = {}
    index = {id(t): i for i, t in enumerate(tasks)}
    for task, result in executor.run(search, tasks, str(root)):
        results[index[id(task)]] = result
        ran = sum(e["ran"] for e in result["evaluations"])
        outcome.ran += ran
        outcome.skipped += len(result["evaluations"]) - ran
        if progress:
            progress.advance(ran > 0)
    groups: dict[tuple[str, str, str], list[SeedCapacity]] = {}
    for i, task in enumerate(tasks):
        t = task.template
        groups.setdefault((t.workload, t.cluster, t.policy), []).append(results[i])
    prices = {c.label: c.price_per_hour for c in spec.clusters}
    for (workload, cluster, policy), per_seed in groups.items():
        summary = combine(per_seed)
        per_hour = prices[cluster]
        outcome.capacity.append({
            "workload": workload, "cluster": cluster, "policy": policy, **summary,
            "price_per_hour": per_hour,
            "requests_per_usd": (summary["mean"] * 3600 / per_hour) if summary["mean"] and per_hour else None,
        })


def _grid_phase(spec: SweepSpec, root: Path, executor: Executor, progress: Progress | None,
                outcome: SweepOutcome) -> None:
    cells = grid_cells(spec, outcome.capacity)
    figures = _run_cells(spec, cells, "grid", root, executor, progress, outcome)
    outcome.cells = cells
    outcome.curves = stability_curves(cells, figures, spec.knee_metric, spec.target)


def _robustness_phase(spec: SweepSpec, root: Path, executor: Executor, progress: Progress | None,
                      outcome: SweepOutcome) -> None:
    """One knob at a time at the [robustness] rate: a curve per knob and (workload, cluster, policy)."""
    templates = [_template(spec, "robust", w, c, p, seed) for w in spec.workloads for c, p in spec.pairs()
                 for seed in spec.seeds]
    assert spec.robustness is not None
    cells = robustness_cells(spec.robustness, templates, {w.label: nominal_rate(w.spec) for w in spec.workloads})
    figures = _run_cells(spec, cells, "robustness", root, executor, progress, outcome)
    for knob, _ in spec.robustness.knobs:
        for curve in stability_curves([c for c in cells if c.axis == knob], figures, spec.knee_metric, spec.target):
            outcome.robustness.append({"knob": knob, "workload": curve["workload"], "cluster": curve["cluster"],
                                       "policy": curve["policy"], "points": curve["points"]})


def _run_cells(spec: SweepSpec, cells: list[Cell], phase: str, root: Path, executor: Executor,
               progress: Progress | None, outcome: SweepOutcome) -> dict[str, Figures]:
    """Run the cells not finished yet (in parallel); every cell's figures by run id."""
    names = [c.run_id for c in cells]
    if len(set(names)) != len(names):
        raise UserError(f"two {phase} values give the same run id (values closer than 10 significant digits)",
                        spec.source)
    todo: list[Cell] = []
    figures: dict[str, Figures] = {}
    for c in cells:
        cached = cached_figures(root, c.run_id, c.key, spec.slo_text) if finished(root / c.run_id, c.key) else None
        if cached is None:
            todo.append(c)
        else:
            figures[c.run_id] = cached
    outcome.skipped += len(figures)
    if progress:
        progress.phase(phase, len(cells), len(figures))
    for _, result in executor.run(execute, todo, str(root), spec.slo_text):
        figures[result["run_id"]] = result["figures"]
        outcome.ran += int(result["ran"])
        outcome.skipped += int(not result["ran"])
        if progress:
            progress.advance(result["ran"])
    return figures


def run_sweep(spec: SweepSpec, results: str | Path, executor: Executor,
              progress: Progress | None = None) -> SweepOutcome:
    """Run (or resume) ``spec`` under ``results/<name>/``; writes summary.json and returns the outcome."""
    root = Path(results) / spec.name
    (root / TRACES).mkdir(parents=True, exist_ok=True)
    write_json_atomic(root / PLAN, {"name": spec.name, "source": spec.source, "sweep": spec.raw,
                                    "updated_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
    outcome = SweepOutcome(root)
    if spec.capacity is not None:
        _capacity_phase(spec, root, executor, progress, outcome)
    if spec.axis is not None:
        _grid_phase(spec, root, executor, progress, outcome)
    if spec.robustness is not None:
        _robustness_phase(spec, root, executor, progress, outcome)
    write_json_atomic(root / SUMMARY, outcome.summary(spec))
    return outcome
