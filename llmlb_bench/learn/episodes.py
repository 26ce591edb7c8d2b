"""Episodes of the routing environment: which trace each ``reset`` simulates.

An episode is one simulated run of a trace. The trace comes from

* a **workload spec** (a preset name of ``workloads/``, a TOML path, or a
  :class:`~llmlb_bench.workload.WorkloadSpec`): each episode generates a fresh
  trace from the spec with its own generation seed; or
* a **trace file** (``llmlb gen`` / ``llmlb trace import`` output, e.g. an
  imported Azure or Mooncake trace): episodes are windows of it.

Training and evaluation are kept apart *by construction*:

* generated traffic: an episode seed ``s`` generates (and simulates) with seed
  ``2 s`` in the ``train`` split and ``2 s + 1`` in the ``eval`` split, so no
  evaluation episode can ever replay a training trace (:func:`generation_seed`);
* a trace file: its rows are cut by arrival time, the first ``1 - eval_fraction``
  of the span for training, the rest for evaluation; requests whose parent (or
  a join's input) lies on the other side of the cut are left out, so each part
  is a trace on its own. An episode is the whole part, or, with ``requests``,
  a window of that many consecutive rows at an offset drawn from the episode
  seed, shifted to start at time 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.errors import UserError
from llmlb_bench.schema import read_trace
from llmlb_bench.workload import WorkloadSpec, generate, load_spec

SPLITS = ("train", "eval")
#: the repository's workload presets (``workloads/NAME.toml``)
WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"


def generation_seed(episode_seed: int, split: str) -> int:
    """The seed a generated episode uses: even for training, odd for evaluation (never shared)."""
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r} (known: {', '.join(SPLITS)})", "split")
    if episode_seed < 0:
        raise UserError(f"episode seed must be >= 0 (got {episode_seed})", "seed")
    return 2 * episode_seed + SPLITS.index(split)


@dataclass
class Episodes:
    """Where episodes' traces come from (see the module docstring)."""

    spec: WorkloadSpec | None
    table: pa.Table | None
    split: str
    requests: int | None
    rate_scale: float
    source: str

    @classmethod
    def from_source(cls, workload: str | Path | WorkloadSpec | pa.Table, *, split: str = "train",
                    requests: int | None = None, rate_scale: float = 1.0, eval_fraction: float = 0.2) -> "Episodes":
        """``workload``: a preset name, a workload spec (.toml) or trace (.parquet) path, a spec, or a
        trace table."""
        generation_seed(0, split)          # checks the split's name
        if requests is not None and requests < 1:
            raise UserError(f"requests must be >= 1 (got {requests})", "requests")
        if not rate_scale > 0:
            raise UserError(f"rate_scale must be > 0 (got {rate_scale})", "rate_scale")
        if isinstance(workload, WorkloadSpec):
            return cls(workload.replace(requests=requests), None, split, requests, rate_scale, workload.source)
        if isinstance(workload, pa.Table):
            return cls(None, _split_trace(workload, split, eval_fraction, "trace"), split, requests, rate_scale,
                       "trace")
        path = Path(workload)
        if path.suffix == ".parquet":
            table = read_trace(path)
            return cls(None, _split_trace(table, split, eval_fraction, str(path)), split, requests, rate_scale,
                       str(path))
        if path.suffix != ".toml":
            preset = WORKLOADS / f"{workload}.toml"
            if not preset.is_file():
                known = sorted(p.stem for p in WORKLOADS.glob("*.toml"))
                raise UserError(f"not a workload preset, spec (.toml) or trace (.parquet) "
                                f"(presets: {', '.join(known)})", str(workload))
            path = preset
        spec = load_spec(path)
        return cls(spec.replace(requests=requests), None, split, requests, rate_scale, str(path))

    def trace(self, episode_seed: int) -> tuple[pa.Table, int]:
        """The episode's trace and the seed its simulation runs with."""
        seed = generation_seed(episode_seed, self.split)
        if self.spec is not None:
            return generate(self.spec, seed=seed, rate_scale=self.rate_scale), seed
        assert self.table is not None
        table = self.table
        if self.requests is not None and self.requests < table.num_rows:
            start = int(np.random.default_rng(seed).integers(0, table.num_rows - self.requests + 1))
            table = _self_contained(table.slice(start, self.requests))
        if table.num_rows:
            arrival = table.column("arrival_s").to_numpy()
            shifted = (arrival - arrival.min()) / self.rate_scale
            table = table.set_column(table.schema.get_field_index("arrival_s"), "arrival_s",
                                     pa.array(shifted, pa.float64()))
        return table, seed

    def describe(self) -> dict[str, object]:
        return {"source": self.source, "split": self.split, "requests": self.requests,
                "rate_scale": self.rate_scale}


def _split_trace(table: pa.Table, split: str, eval_fraction: float, where: str) -> pa.Table:
    """The ``split`` part of a trace file, cut by arrival time (see the module docstring)."""
    if not 0.0 < eval_fraction < 1.0:
        raise UserError(f"eval_fraction must be between 0 and 1 (got {eval_fraction})", "eval_fraction")
    if table.num_rows < 2:
        raise UserError("a trace needs at least 2 rows to split into training and evaluation", where)
    table = table.sort_by([("arrival_s", "ascending"), ("request_id", "ascending")])
    arrival = table.column("arrival_s")
    lo, hi = pc.min(arrival).as_py(), pc.max(arrival).as_py()
    cut = lo + (hi - lo) * (1.0 - eval_fraction)
    keep = pc.less(arrival, cut) if split == "train" else pc.greater_equal(arrival, cut)
    part = _self_contained(table.filter(keep))
    if part.num_rows == 0:
        raise UserError(f"the {split} part of the trace is empty (eval_fraction {eval_fraction})", where)
    return part


def _self_contained(table: pa.Table) -> pa.Table:
    """``table`` without the requests that wait for a request it does not hold (repeated until none)."""
    while table.num_rows:
        ids = table.column("request_id")
        parents = table.column("parent_id")
        ok = pc.or_(pc.is_null(parents), pc.is_in(parents, value_set=ids.combine_chunks()))
        if "wait_ids" in table.column_names:
            waits = table.column("wait_ids").combine_chunks()
            lengths = pc.list_value_length(waits).fill_null(0).to_numpy(zero_copy_only=False)
            flat = pc.list_flatten(waits)
            held = pc.is_in(flat, value_set=ids.combine_chunks()).to_numpy(zero_copy_only=False)
            owner = np.repeat(np.arange(table.num_rows), lengths)
            missing = np.zeros(table.num_rows, dtype=bool)
            missing[owner[~held]] = True
            ok = pc.and_(ok, pa.array(~missing))
        ok_np = ok.to_numpy(zero_copy_only=False) if isinstance(ok, pa.Array) else ok.combine_chunks().to_numpy(
            zero_copy_only=False)
        if ok_np.all():
            return table
        table = table.filter(pa.array(ok_np))
    return table
