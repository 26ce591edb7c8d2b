"""The evidence a gate decides on: per-request samples and per-run figures of each side.

A side (baseline or candidate) is one or more run folders or results
directories. Its runs are split into *cases*: the cells of a sweep (runs
whose run.json has ``config.sweep`` are grouped by workload, cluster, policy
and rate; their seeds are repeats), or else one case holding every run (the
repeats of one configuration). Per run the gate keeps, request by request
(sorted by request id), the id, whether it was ok and good, and its latencies
(NaN where the request was not ok or has no such latency); the run's
duration, the SHA-256 of the trace it replayed (so that runs of the same trace
on both sides can be paired) and its summary (for run-level figures such as
Jain's index) and its workload identity (what must match the other side's:
:mod:`llmlb_bench.metrics.comparable`), all from
:func:`llmlb_bench.metrics.summary.summarize` and the ``request_metrics``
view, so a gate's numbers are the report's numbers.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from llmlb_bench.errors import UserError
from llmlb_bench.gate.rules import LATENCIES
from llmlb_bench.metrics.comparable import workload_identity
from llmlb_bench.metrics.meta import table as meta_table
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, metas_of, summarize
from llmlb_bench.store.views import Catalog

ALL = "all runs"


@dataclass
class RunSample:
    run_id: str
    window_s: float                    # the arrival window (s): rates are per second of it, as in the report
    ok: np.ndarray                     # bool per request
    good: np.ndarray                   # bool per request (False without an SLO)
    latency: dict[str, np.ndarray]     # column -> value per request (NaN: not ok, or none)
    #: the figures a run-level rule reads by path: the run's (metrics.run_figures.RunFigures), or a sweep seed's capacity
    summary: Mapping[str, object] = field(repr=False)
    request_id: np.ndarray | None = None  # int per request, ascending (None: figures only, no requests)
    trace: str | None = None              # SHA-256 of the trace file the run replayed
    #: what must match across the sides (metrics.comparable.workload_identity; a sweep's SLO and target)
    workload: dict[str, object] = field(default_factory=dict)


def case_of(meta: Mapping[str, object]) -> str:
    config = meta.get("config")
    sweep = config.get("sweep") if isinstance(config, dict) else None
    if not isinstance(sweep, dict) or sweep.get("phase", "grid") != "grid":
        return ALL
    return "/".join(str(sweep.get(k)) for k in ("workload", "cluster", "policy")) + f" @ {sweep['axis']} {sweep['x']:g}"


def load_side(paths: Iterable[str | Path], slo: Slo | None) -> dict[str, list[RunSample]]:
    """Runs under ``paths`` with request rows, by case (see the module docstring)."""
    paths = list(paths)
    cat = Catalog(paths)
    cat.con.execute("SET threads TO 1")  # identical figures on every call (parallel float sums are not)
    cat.con.execute("SET enable_progress_bar = false")
    summaries = {s["run_id"]: s for s in summarize(cat, slo, Options(ci=False))}
    if not summaries:
        raise UserError("no runs with request rows", ", ".join(map(str, paths)))
    good = f"coalesce({slo.predicate()}, false)" if slo else "false"
    cols = ", ".join(f"{lat}_s" for lat in LATENCIES)
    table = cat.query(f"SELECT run_id, request_id, status = 'ok' AS ok, {good} AS good, {cols} FROM request_metrics "
                      f"ORDER BY run_id, request_id")
    run_ids = np.asarray(table["run_id"].to_pylist(), dtype=object)
    # rows come sorted by run: one slice per run
    edges = np.concatenate([[0], np.flatnonzero(run_ids[1:] != run_ids[:-1]) + 1, [len(run_ids)]])
    slices = {run_ids[a]: slice(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a}
    ok_all = table["ok"].to_numpy(zero_copy_only=False).astype(bool)
    good_all = table["good"].to_numpy(zero_copy_only=False).astype(bool)
    lat_all = {f"{lat}_s": table[f"{lat}_s"].to_numpy(zero_copy_only=False).astype(float) for lat in LATENCIES}
    ids_all = table["request_id"].to_numpy(zero_copy_only=False).astype(np.int64)
    metas = metas_of(cat.runs_table)
    cases: dict[str, list[RunSample]] = defaultdict(list)
    for run_id, s in summaries.items():
        rows = slices[run_id]
        ok = ok_all[rows]
        latency = {col: np.where(ok, values[rows], np.nan) for col, values in lat_all.items()}
        meta = metas.get(run_id, {})
        sha = meta_table(meta, "trace").get("sha256")
        cases[case_of(meta)].append(RunSample(run_id, s["window_s"], ok, good_all[rows], latency, s,
                                              ids_all[rows], sha if isinstance(sha, str) else None,
                                              workload_identity(meta)))
    return dict(cases)


def load_capacities(paths: Iterable[str | Path]) -> dict[str, list[RunSample]]:
    """Per-seed capacities from sweeps' summary.json, by ``capacity: workload/cluster/policy``.

    Each seed's capacity becomes one sample (a seed that met the target at no
    rate counts 0, as in the sweep's own mean), so a capacity rule is decided
    over seeds like any run-level figure.
    """
    cases: dict[str, list[RunSample]] = defaultdict(list)
    for p in map(Path, paths):
        files = [p / "summary.json"] if (p / "summary.json").is_file() else sorted(p.glob("*/summary.json"))
        if not files:
            raise UserError("no sweep summary.json here: capacity rules compare llmlb sweep results "
                            "with a [capacity] section", p)
        for f in files:
            doc = json.loads(f.read_text())
            for row in doc.get("capacity") or []:
                case = f"capacity: {row['workload']}/{row['cluster']}/{row['policy']}"
                judged = {"slo": doc.get("slo"), "attainment target": doc.get("target")}
                for s in row["per_seed"]:
                    cases[case].append(RunSample(f"{doc['sweep']} seed {s['seed']}", 0.0, np.zeros(0, bool),
                                                 np.zeros(0, bool), {}, {"capacity": s["capacity"] or 0.0},
                                                 workload=judged))
    return dict(cases)
