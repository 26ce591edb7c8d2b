"""Verdicts: which run is better than the baseline, by how much, and whether it is beyond noise.

Runs are compared only with runs of the same workload
(:mod:`llmlb_bench.metrics.comparable`): a report over runs of several
workloads gives a verdict per group, each against its own baseline, and a
note naming the fields the groups differ in. The baseline of a group is the
run created first, or the one named with ``--baseline``
(:mod:`llmlb_bench.report.baseline`: in each group, the run it names; a group
without one is not compared). For every other run and each headline figure (TTFT, TPOT
and E2E p99, throughput; attainment and goodput with an SLO) the verdict
gives the relative change, candidate / baseline - 1, with its bootstrap
interval and a two-sided p-value, all from the gate's statistics
(:func:`llmlb_bench.gate.decide.relative_change`: requests redrawn within
each run, paired by trace when both runs replayed the same one). The
p-values of one comparison are Holm-adjusted over its figures, so "beyond
noise" means the same thing however many figures are shown; a change is
*significant* when its adjusted p-value is below 1 - confidence and it is at
least :data:`NEGLIGIBLE` (1%) in size; smaller ones count as within noise.

Each comparison is summed up in one sentence a reader can act on:
``least_outstanding vs round_robin: TTFT p99 -23% [-28, -18] better,
goodput +4% [+1, +7] better; other differences within noise``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from llmlb_bench.metrics import comparable
from llmlb_bench.metrics.meta import table
from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.sql import quote
from llmlb_bench.metrics.summary import metas_of
from llmlb_bench.report.baseline import named, pick_baseline
from llmlb_bench.report.shape import Comparison, FigureChange, ReportDoc, VerdictGroup, Verdicts
from llmlb_bench.store.views import Catalog

if TYPE_CHECKING:   # the gate is imported where the verdicts are computed
    from llmlb_bench.gate.samples import RunSample

#: gate metric -> (name in a sentence, whether higher is better)
HEADLINE = {"p99_ttft": ("TTFT p99", False), "p99_tpot": ("TPOT p99", False), "p99_e2e": ("E2E p99", False),
            "throughput": ("throughput", True)}
HEADLINE_SLO = {"attainment": ("attainment", True), "goodput": ("goodput", True)}
#: comparisons beyond this many runs are left out (each one redraws every request 2,000 times)
MAX_RUNS = 12
#: ... and beyond this many requests in all
MAX_REQUESTS = 2_000_000


#: changes smaller than this are called negligible even when the bootstrap tells them from zero
#: (a paired bootstrap resolves a 0.1% throughput change that no reader should act on)
NEGLIGIBLE = 0.01


def _pct(x: float) -> str:
    return (f"{100 * x:+.1f}" if abs(x) < 0.1 else f"{100 * x:+.0f}").replace("-", "−")


def _change_text(c: FigureChange) -> str:
    low, high = c["low"], c["high"]
    iv = f" [{_pct(low)}, {_pct(high)}]" if low is not None and high is not None else ""
    return f"{c['figure']} {_pct(c['change'])}%{iv}" + (f" {c['direction']}" if c["significant"] else "")


def sentence(candidate: str, baseline: str, changes: list[FigureChange]) -> str:
    """The one line of a comparison."""
    head = f"{candidate} vs {baseline}"
    sig = [c for c in changes if c["significant"]]
    if not sig:
        return f"{head}: no difference beyond noise on {len(changes)} figures"
    rest = "; other differences within noise" if len(sig) < len(changes) else ""
    return f"{head}: " + ", ".join(_change_text(c) for c in sig) + rest


def verdict_lines(doc: ReportDoc) -> list[str]:
    """The sentences on top of a report (or why there are none)."""
    v = doc.get("verdicts")
    if not v:
        return []
    note = v["note"]
    return [c["sentence"] for c in v["comparisons"]] or ([note] if note else [])


def _samples(cat: Catalog, runs: list[RunFigures], slo: Slo | None,
             metas: Mapping[str, Mapping[str, object]]) -> dict[str, RunSample]:
    """The gate's per-run samples (:class:`llmlb_bench.gate.samples.RunSample`) read from the report's own
    catalog, whose ``request_metrics`` view the summary made: one query, no second summary. Rates are
    per second of the arrival window, as the report's."""
    from llmlb_bench.gate.rules import LATENCIES
    from llmlb_bench.gate.samples import RunSample

    good = f"coalesce({slo.predicate()}, false)" if slo else "false"
    cols = ", ".join(f"{lat}_s" for lat in LATENCIES)
    out: dict[str, RunSample] = {}
    for s in runs:
        t = cat.query(f"SELECT request_id, status = 'ok' AS ok, {good} AS good, {cols} FROM request_metrics "
                      f"WHERE run_id = {quote(s['run_id'])} ORDER BY request_id")
        ok = t["ok"].to_numpy(zero_copy_only=False).astype(bool)
        latency = {f"{lat}_s": np.where(ok, t[f"{lat}_s"].to_numpy(zero_copy_only=False).astype(float), np.nan)
                   for lat in LATENCIES}
        out[s["run_id"]] = RunSample(
            s["run_id"], s.get("window_s") or s["duration_s"], ok,
            t["good"].to_numpy(zero_copy_only=False).astype(bool), latency, s,
            t["request_id"].to_numpy(zero_copy_only=False).astype(np.int64),
            _sha256(table(metas.get(s["run_id"]) or {}, "trace").get("sha256")))
    return out


def _sha256(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _groups_note(groups: list[list[RunFigures]], metas: Mapping[str, Mapping[str, object]],
                 baseline: str | None, bases: list[RunFigures | None]) -> str:
    """Why some runs are not compared with others: the groups, and the fields each differs from the first in."""
    first = comparable.workload_identity(metas.get(groups[0][0]["run_id"], {}))
    parts = []
    for i, g in enumerate(groups):
        meta = metas.get(g[0]["run_id"], {})
        head = f"{comparable.describe(meta)} ({len(g)} run{'s' if len(g) != 1 else ''})"
        if i:
            head += f": {comparable.differences_text(first, comparable.workload_identity(meta))}"
        parts.append(head)
    missing = sum(b is None for b in bases)
    scope = ("each group is compared within itself, against the run created first" if baseline is None else
             f"each group is compared with its run {baseline!r}"
             + (f"; {missing} group(s) without one are not compared" if missing else ""))
    return (f"these runs are of {len(groups)} different workloads, and runs of different workloads are not "
            f"compared ({scope}): " + "; ".join(parts))


def verdicts(cat: Catalog, runs: list[RunFigures], slo: Slo | None, baseline: str | None,
             confidence: float = 0.95, seed: int = 0) -> Verdicts | None:
    """``{baseline, groups, comparisons: [{candidate, baseline, changes: [...], sentence}], note, groups_note}``
    (None: one run). ``groups``: the runs of each workload with its baseline (None: a group
    without a run ``baseline`` names); ``groups_note``: why runs of different groups are not compared (None: one
    group)."""
    if len(runs) < 2:
        return None
    metas = metas_of(cat.runs_table)
    groups = comparable.groups(runs, [metas.get(s["run_id"], {}) for s in runs])
    bases = [pick_baseline(g, baseline) for g in groups]
    if baseline is not None and not any(bases):
        named(runs, baseline)      # names no run at all: the error lists the runs
    pairs: list[tuple[RunFigures, RunFigures]] = []
    shown: list[VerdictGroup] = []
    for g, base in zip(groups, bases):
        if base is not None:
            pairs += [(base, s) for s in g if s is not base]
        shown.append({"runs": [s["run_id"] for s in g], "baseline": None if base is None else base["run_id"],
                      "workload": comparable.describe(metas.get(g[0]["run_id"], {}))})
    groups_note = _groups_note(groups, metas, baseline, bases) if len(groups) > 1 else None

    def made(comparisons: list[Comparison], note: str | None) -> Verdicts:
        return {"baseline": next((g["baseline"] for g in shown if g["baseline"]), None), "confidence": confidence,
                "groups": shown, "groups_note": groups_note, "comparisons": comparisons, "note": note}

    involved = {s["run_id"]: s for pair in pairs for s in pair}
    if not pairs:
        return made([], None)
    if len(involved) > MAX_RUNS:
        return made([], f"{len(involved)} runs: verdicts are computed for at most {MAX_RUNS}; report fewer runs")
    total = sum(s["requests"] for s in involved.values())
    if total > MAX_REQUESTS:
        return made([], f"{total:,} requests: verdicts are computed up to {MAX_REQUESTS:,} (each redraws every "
                        f"request 2,000 times); compare these runs with llmlb gate")
    from llmlb_bench.gate.decide import holm, relative_change

    samples = _samples(cat, list(involved.values()), slo, metas)
    figures = {**HEADLINE, **(HEADLINE_SLO if slo is not None else {})}
    out: list[Comparison] = []
    for base, s in pairs:
        changes: list[FigureChange] = []
        for metric, (label, higher) in figures.items():
            c = relative_change(metric, [samples[base["run_id"]]], [samples[s["run_id"]]], confidence, seed)
            if c.change is None:
                continue
            better = (c.change > 0) == higher
            changes.append({"metric": metric, "figure": label, "baseline_value": c.baseline,
                            "candidate_value": c.candidate, "change": c.change, "low": c.low, "high": c.high,
                            "p_value": c.p_value, "design": c.design,
                            "direction": "better" if better else "worse", "p_adjusted": None, "significant": False})
        known = [(i, p) for i, c in enumerate(changes) if (p := c["p_value"]) is not None]
        adjusted: np.ndarray | list[float] = holm([p for _, p in known]) if known else []
        for (i, _), p in zip(known, adjusted):
            changes[i]["p_adjusted"] = float(p)
            changes[i]["significant"] = bool(p < 1 - confidence) and abs(changes[i]["change"]) >= NEGLIGIBLE
        cand, against = s.get("name") or s["run_id"], base.get("name") or base["run_id"]
        out.append({"candidate": cand, "candidate_run": s["run_id"], "baseline": against,
                    "baseline_run": base["run_id"], "changes": changes, "sentence": sentence(cand, against, changes)})
    return made(out, None)
