"""The simulator's power and energy against published measurements (ML.ENERGY leaderboard v3.0).

Each measured configuration (``catalog/power_measurements.toml``: model, GPU, tensor-parallel
degree, batch size) is replayed the way it was measured: ``num_requests`` requests sent at
once to one replica whose ``max_num_seqs`` is the batch size, output lengths drawn from the
measured histogram, and the figures taken over the same steady-state window (from the moment
``max_num_seqs`` requests have their first token to the moment ``num_requests -
max_num_seqs - 1`` have finished). Power, energy per output token and throughput in that
window are compared with the measured ones, with the GPU's catalog terms as they stand (for H100
and B200 the terms fitted to these measurements, ``[fit.<gpu>]`` of the same file) or with
other terms (:class:`Fit`; e.g. ``[fit_without_overhead.<gpu>]``, the model before the
sequence overhead was on; the fit itself is :mod:`llmlb_bench.sim.energy_fit`).

The source does not publish its prompt lengths (LMArena conversations, each turn a request
with its history); :data:`PROMPT_MEAN` is an assumption, and docs/simulator.md reports how
much the figures move with it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow.parquet as pq

from llmlb_bench.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

#: mean prompt length (tokens) assumed for the LMArena chat prompts (lognormal, sigma PROMPT_SIGMA)
PROMPT_MEAN = 200.0
PROMPT_SIGMA = 1.0


@dataclass(frozen=True)
class Measured:
    """One measured configuration (fields as in ``catalog/power_measurements.toml``)."""

    model: str
    gpu: str
    tp: int
    max_num_seqs: int
    num_requests: int
    avg_batch_size: float
    avg_power_w: float
    energy_per_token_j: float
    output_tokens_per_s: float
    median_itl_ms: float
    avg_output_len: float
    output_len_counts: tuple[int, ...]
    output_len_bins: tuple[float, float]

    @property
    def label(self) -> str:
        return f"{self.model} {self.gpu} tp{self.tp} b{self.max_num_seqs}"


@dataclass(frozen=True)
class Simulated:
    """The simulator's figures over the steady-state window of one configuration."""

    cell: Measured
    avg_power_w: float
    energy_per_token_j: float
    output_tokens_per_s: float
    avg_batch_size: float

    @property
    def power_error(self) -> float:
        return self.avg_power_w / self.cell.avg_power_w - 1.0

    @property
    def energy_error(self) -> float:
        return self.energy_per_token_j / self.cell.energy_per_token_j - 1.0

    @property
    def throughput_error(self) -> float:
        return self.output_tokens_per_s / self.cell.output_tokens_per_s - 1.0


@dataclass(frozen=True)
class Fit:
    """Step-time and power terms of one GPU fitted to its measured cells (a ``[fit.<gpu>]`` table
    of ``catalog/power_measurements.toml``; how: :mod:`llmlb_bench.sim.energy_fit`). They override
    the GPU's catalog entry when a cell is simulated with them (:func:`simulate_cell`)."""

    gpu: str
    #: the models whose cells the terms were fitted to
    models: tuple[str, ...]
    sequence_overhead_us: float
    memory_power_fraction: float
    compute_power_scale: float

    def terms(self) -> dict[str, float]:
        """The catalog fields this fit sets."""
        return {"sequence_overhead_us": self.sequence_overhead_us,
                "memory_power_fraction": self.memory_power_fraction,
                "compute_power_scale": self.compute_power_scale}


def _read(path: str | Path | None) -> tuple[dict[str, Any], str]:
    where = str(path) if path is not None else "llmlb_bench/catalog/power_measurements.toml"
    source = Path(path) if path is not None else resources.files("llmlb_bench") / "catalog" / "power_measurements.toml"
    try:
        return tomllib.loads(source.read_text(encoding="utf-8")), where
    except FileNotFoundError:
        raise UserError("no such file", where) from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"not a power-measurements file ({exc})", where) from None


def load_fits(path: str | Path | None = None, table: str = "fit") -> dict[str, Fit]:
    """The fitted terms of ``table`` by GPU name (the built-in file unless ``path`` is given):
    ``fit``, the catalog's (sequence overhead on), or ``fit_without_overhead``, the model before it
    was on (sequence overhead 0, the power terms fitted without it), kept so its errors stay reproducible."""
    data, where = _read(path)
    try:
        return {gpu: Fit(gpu=gpu, models=tuple(t["models"]), sequence_overhead_us=float(t["sequence_overhead_us"]),
                         memory_power_fraction=float(t["memory_power_fraction"]),
                         compute_power_scale=float(t["compute_power_scale"]))
                for gpu, t in data.get(table, {}).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"not a power-measurements file ({table}: {exc})", where) from None


def load_measurements(path: str | Path | None = None) -> list[Measured]:
    """The measured configurations (the built-in file unless ``path`` is given)."""
    data, where = _read(path)
    try:
        lo, hi = data["output_len_bins"]
        cells = [Measured(output_len_bins=(float(lo), float(hi)), output_len_counts=tuple(c.pop("output_len_counts")),
                          **c) for c in data["cell"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"not a power-measurements file ({exc})", where) from None
    return cells


def lengths(cell: Measured, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) lengths of the cell's requests: outputs drawn uniformly inside the
    measured histogram's bins (in proportion to their counts), prompts lognormal around
    :data:`PROMPT_MEAN`; prompt + output within the model's context."""
    rng = np.random.default_rng(seed)
    counts = np.asarray(cell.output_len_counts, dtype=float)
    edges = np.linspace(*cell.output_len_bins, len(counts) + 1)
    k = rng.choice(len(counts), size=cell.num_requests, p=counts / counts.sum())
    out = np.maximum(1, rng.uniform(edges[k], edges[k + 1])).astype(np.int64)
    mu = np.log(PROMPT_MEAN) - PROMPT_SIGMA ** 2 / 2
    prompt = np.clip(rng.lognormal(mu, PROMPT_SIGMA, cell.num_requests), 1, 4096).astype(np.int64)
    return prompt, out


def simulate_cell(cell: Measured, seed: int = 0, cluster: Mapping[str, object] | None = None,
                  fit: Fit | None = None) -> Simulated:
    """Replay ``cell`` in the simulator and take its steady-state figures (see the module
    docstring). ``cluster`` adds settings to the one-replica cluster (e.g. a pool's frequency);
    ``fit`` replaces the GPU's catalog terms with the fitted ones (a catalog file of the run's own)."""
    from llmlb_bench.policies import make_policy
    from llmlb_bench.schema import trace_table
    from llmlb_bench.sim import ClusterConfig, simulate
    from llmlb_bench.store import RunStore

    prompt, out = lengths(cell, seed)
    n = cell.num_requests
    trace = trace_table(np.zeros(n), prompt, out, "power_check")
    window_guess = float(out.sum()) / max(1, cell.max_num_seqs) * cell.median_itl_ms / 1e3
    with tempfile.TemporaryDirectory(prefix="llmlb-power-check-") as tmp:
        settings = dict(cluster or {})
        if fit is not None:
            settings["catalogs"] = [str(fitted_catalog(fit, Path(tmp)))]
        cfg = ClusterConfig.build(replicas=1, gpu=cell.gpu, model=cell.model, tp=cell.tp,
                                  max_num_seqs=cell.max_num_seqs, max_num_batched_tokens=8192,
                                  enable_prefix_caching=False, token_times="summary",
                                  series_interval_s=max(1e-3, window_guess / 2000), **settings)
        with RunStore(Path(tmp), config={"cluster": cfg.to_dict()}, backend="sim", run_id="cell") as run:
            simulate(trace, cfg, make_policy("round_robin"), run, seed=seed)
        req = pq.read_table(run.dir / "requests.parquet", columns=["first_token_s", "last_token_s", "output_tokens"])
        series = pq.read_table(run.dir / "series.parquet", columns=["t_s", "running", "power_w"])
    first = req.column("first_token_s").to_numpy()
    last = req.column("last_token_s").to_numpy()
    tokens = req.column("output_tokens").to_numpy()
    b = cell.max_num_seqs
    start = float(np.sort(first)[b - 1])
    end = float(np.sort(last)[n - b - 2])
    if end <= start:
        raise UserError(f"{cell.label}: no steady state ({n} requests for a batch of {b})", "power_check")
    made = _tokens_between(first, last, tokens, start, end)
    t = series.column("t_s").to_numpy()
    power = series.column("power_w").to_numpy()
    energy = _energy_between(t, power, start, end)
    inside = (t > start) & (t <= end)
    running = series.column("running").to_numpy()[inside]
    span = end - start
    return Simulated(cell, energy / span, energy / made, made / span, float(running.mean()) if running.size else 0.0)


def _tokens_between(first: np.ndarray, last: np.ndarray, tokens: np.ndarray, a: float, b: float) -> float:
    """Output tokens emitted in (a, b]: each request's first token at ``first``, the others
    evenly spaced up to ``last``."""
    gaps = np.where(tokens > 1, (last - first) / np.maximum(tokens - 1, 1), 0.0)
    def upto(t: float) -> np.ndarray:
        done = np.where(gaps > 0, np.floor((t - first) / np.where(gaps > 0, gaps, 1.0)) + 1, 1.0)
        return np.where(t < first, 0.0, np.minimum(done, tokens))
    return float((upto(b) - upto(a)).sum())


def _energy_between(t: np.ndarray, power: np.ndarray, a: float, b: float) -> float:
    """Joules in (a, b] from samples of mean power over (previous t, t]."""
    prev = np.concatenate(([0.0], t[:-1]))
    overlap = np.clip(np.minimum(t, b) - np.maximum(prev, a), 0.0, None)
    return float((power * overlap).sum())


def fitted_catalog(fit: Fit, folder: Path) -> Path:
    """A user catalog file in ``folder`` holding the GPU's built-in entry with the fitted terms."""
    from llmlb_bench.sim.catalog import load_catalog

    entry = {**dataclasses.asdict(load_catalog().gpu(fit.gpu)), **fit.terms()}
    del entry["name"]
    lines = [f"[gpus.{fit.gpu}]"] + [f"{k} = {json.dumps(v)}" for k, v in entry.items()]
    path = folder / f"fitted-{fit.gpu}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def compare(cells: Sequence[Measured], seed: int = 0, fits: dict[str, Fit] | None = None) -> list[Simulated]:
    """Each cell simulated, with its GPU's fitted terms where ``fits`` has them."""
    return [simulate_cell(c, seed, fit=(fits or {}).get(c.gpu)) for c in cells]


def table(rows: Sequence[Simulated]) -> str:
    """A Markdown table of measured vs simulated figures."""
    head = ("| model | GPU | tp | batch | power W (meas.) | power W (sim.) | error | J/token (meas.) | "
            "J/token (sim.) | error | tokens/s error | running (meas. / sim.) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        c = r.cell
        lines.append(f"| {c.model} | {c.gpu} | {c.tp} | {c.max_num_seqs} | {c.avg_power_w:.0f} | {r.avg_power_w:.0f} | "
                     f"{r.power_error:+.1%} | {c.energy_per_token_j:.4f} | {r.energy_per_token_j:.4f} | "
                     f"{r.energy_error:+.1%} | {r.throughput_error:+.1%} | {c.avg_batch_size:.0f} / {r.avg_batch_size:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":   # pragma: no cover - the benchmark entry point is benchmarks/energy_vs_measured.py
    print(table(compare(load_measurements())))
