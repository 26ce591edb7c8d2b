"""One cell of a sweep: a workload at one rate, on one cluster, under one policy, with one seed.

A cell is plain data (picklable, so any executor can ship it to a worker)
and runs through :func:`execute`, the only function a worker calls. Its
run id is made from its coordinates, so the same sweep always writes the same
folders; its ``key`` hashes everything that determines its result, and
run.json keeps both under ``config.sweep``. That is what makes a sweep
resumable: a folder whose run.json is ``complete`` with the same key is a
finished cell and is skipped; anything else of ours is an interrupted cell
and is run again.

Traces are shared between the cells that differ only in cluster or policy.
They are content-addressed (the file name carries a hash of spec, rate
scale and seed) and written to a private temporary name and renamed, so two
workers that need the same trace at once both write identical bytes and
neither can read a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, TypedDict

import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.experiment import simulate_run
from llmlb_bench.schema import read_trace, write_trace
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.store.run import RUN_JSON
from llmlb_bench.sweep.figures import Figures, cached_figures, compute_figures
from llmlb_bench.workload import WorkloadSpec, generate

TRACES = "traces"


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def fmt(x: float) -> str:
    """A rate or scale as it appears in run ids: short, but exact to 10 significant digits."""
    return f"{x:.10g}"


class Coordinates(TypedDict):
    """A cell's place in its sweep, as run.json keeps it under ``config.sweep``."""

    name: str
    phase: str
    workload: str
    cluster: str
    policy: str
    axis: str
    x: float
    rate_scale: float
    rate: float
    load: float | None
    seed: int
    key: str


class CellResult(TypedDict):
    """:func:`execute`'s answer: the cell's run id, whether it ran now (False: reused) and its figures."""

    run_id: str
    ran: bool
    figures: Figures


@dataclass(frozen=True)
class Cell:
    """Everything one simulated run of a sweep needs, and its place in the grid."""

    sweep: str
    phase: str                      # "grid" or "capacity"
    workload: str
    cluster: str
    policy: str
    axis: str                       # rate_scale, rate or load
    x: float                        # the value on that axis
    rate_scale: float
    rate: float                     # offered req/s (the spec's nominal rate x rate_scale)
    seed: int
    workload_spec: Mapping[str, object] = field(repr=False)
    workload_source: str = field(default="<spec>", repr=False)
    cluster_config: Mapping[str, object] = field(default_factory=dict, repr=False)
    policy_name: str = ""
    policy_args: Mapping[str, object] = field(default_factory=dict)
    load: float | None = None       # rate / the reference capacity, when one is known

    @property
    def run_id(self) -> str:
        head = "cap." if self.phase == "capacity" else ""
        return f"{head}{self.workload}.{self.cluster}.{self.policy}.{self.axis}{fmt(self.x)}.s{self.seed}"

    @property
    def key(self) -> str:
        """Hash of what determines the cell's result (not its labels): a changed sweep file changes it."""
        return _digest({"workload": self.workload_spec, "rate_scale": self.rate_scale,
                        "cluster": self.cluster_config, "policy": self.policy_name, "args": self.policy_args,
                        "seed": self.seed})

    def coordinates(self) -> Coordinates:
        """What run.json records under ``config.sweep`` (and ``llmlb query`` can group by)."""
        return {"name": self.sweep, "phase": self.phase, "workload": self.workload, "cluster": self.cluster,
                "policy": self.policy, "axis": self.axis, "x": self.x, "rate_scale": self.rate_scale,
                "rate": self.rate, "load": self.load, "seed": self.seed, "key": self.key}

    def trace_path(self, root: Path) -> Path:
        tag = _digest({"spec": self.workload_spec, "rate_scale": self.rate_scale, "seed": self.seed})[:12]
        return root / TRACES / f"{self.workload}.rs{fmt(self.rate_scale)}.s{self.seed}.{tag}.parquet"


def finished(run_dir: Path, key: str) -> bool:
    """True for a complete run of this cell; False (after clearing it) for an interrupted one.

    A complete run with another key is a different experiment stored under
    the same name (the sweep file changed): refusing is safer than
    overwriting results someone may still want.
    """
    meta_path = run_dir / RUN_JSON
    if not meta_path.is_file():
        if run_dir.exists():
            shutil.rmtree(run_dir)
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError):
        meta = {}
    stored = ((meta.get("config") or {}).get("sweep") or {}).get("key")
    if meta.get("status") == "complete":
        if stored == key:
            return True
        raise UserError("holds a finished run of a different sweep definition (the sweep file changed?); "
                        "use another --results folder or remove it", run_dir)
    shutil.rmtree(run_dir)
    return False


def ensure_trace(cell: Cell, root: Path) -> tuple[pa.Table, Path]:
    """The cell's trace, generated once and then read from the sweep's traces folder."""
    path = cell.trace_path(root)
    if not path.is_file():
        spec = WorkloadSpec.from_dict(cell.workload_spec, cell.workload_source)
        table = generate(spec, seed=cell.seed, rate_scale=cell.rate_scale)
        tmp = path.with_name(f".{os.getpid()}-{secrets.token_hex(4)}-{path.name}")
        try:
            # the spec as generated: the cell's seed, so the trace names its own seed (report footers)
            write_trace(table, tmp, spec=spec.replace(seed=cell.seed).to_dict(), block_size=spec.block_size)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
    return read_trace(path), path


def execute(cell: Cell, root: str | Path, slo: str | None) -> CellResult:
    """Run ``cell`` into ``root/<run_id>`` unless it is already finished, and return its figures
    judged by ``slo``; the worker's entry point.

    Returns ``{"run_id", "ran", "figures"}`` (``ran`` False when the stored run was reused).
    """
    root = Path(root)
    run_dir = root / cell.run_id
    ran = not finished(run_dir, cell.key)
    if ran:
        table, trace_path = ensure_trace(cell, root)
        cluster = ClusterConfig.from_dict(cell.cluster_config)
        simulate_run(table, trace_path, cluster, cell.policy_name, cell.policy_args, cell.seed, root,
                     label=cell.policy, run_id=cell.run_id, sweep=cell.coordinates())
    figures = None if ran else cached_figures(root, cell.run_id, cell.key, slo)
    if figures is None:
        figures = compute_figures(root, cell.run_id, cell.key, slo)
    return {"run_id": cell.run_id, "ran": ran, "figures": figures}
