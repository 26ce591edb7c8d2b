"""The step-time and power terms fitted to the ML.ENERGY measurements (``[fit.<gpu>]`` of
``catalog/power_measurements.toml``), and the step-time budget that shows what the roofline
leaves out.

A measured configuration's steady state is a batch of ``avg_batch_size`` running requests
(B) emitting ``output_tokens_per_s`` tokens, one per request per step, so its MEAN STEP is
T = B / throughput. Its average composition follows from the request lengths the simulator
draws for it (:func:`llmlb_bench.sim.power_check.lengths`): a request of prompt p and output
l spends about l steps in the batch, so B / mean(l) requests start per step (each a prefill
of p tokens attending to its own prefix, one chunk since p <= 4096 < the 8192-token
budget) and the others decode at the context a running request has on average, (mean(p l) +
mean(l (l + 1) / 2)) / mean(l) (longer requests are in the batch for longer). That average
step, through :meth:`CostModel.run_step`, is what the roofline predicts for T.

The sequence overhead s is fitted on the mean steps: the step time is linear in it
(T_i = R_i + s n_i, n_i the sequences sampled per step), so it has a closed-form
least-squares value, reproducible in a fast test. The power floor f and scale k are fitted
on FULL simulations of the cells instead (:func:`fit_power_simulated`), because power is
concave in a step's compute share and a real steady state mixes steps with and without a
prefill chunk, so the mean step's power is biased (fitted on mean steps, the simulated power
of Llama 3 8B on H100 came out 4-9% low). That stays cheap because power is affine in the
floor (the busy activity f + (1 - f) g is) and step times do not depend on f or k: two
simulations per cell give the least-squares floor of a scale in closed form, and the scale
is searched on a grid. The fitted terms are the catalog's for H100 and B200, so
benchmarks/energy_vs_measured.py reports the errors where the fit is used; docs/simulator.md
publishes them.

Out of sample (:func:`holdouts`, :func:`fit_cells`): the same fit on part of the cells, with and
without the sequence overhead, and full simulations of the rest (benchmarks/energy_vs_measured.py
--holdout; docs/fidelity.md publishes the errors).

Errors are relative (every cell counts the same whatever its size), least squares.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from llmlb_bench.sim.catalog import GPU, load_catalog
from llmlb_bench.sim.cost import CostModel
from llmlb_bench.sim.power_check import Fit, Measured, lengths, simulate_cell

#: the compute power scales tried (the floor is solved in closed form for each)
SCALES = tuple(round(0.01 * i, 2) for i in range(2, 101))
#: the two floors at which power is evaluated to solve for the best one (it is affine in the floor)
FLOORS = (0.5, 1.0)


@dataclass(frozen=True)
class MeanStep:
    """A measured configuration's average steady-state step, in :meth:`CostModel.run_step`'s terms."""

    cell: Measured
    tokens: int
    attn: float
    kv: float
    sampled: int
    #: running requests that decode in the step, and the context each has on average
    decoding: float
    context: float
    #: measured mean step time: avg_batch_size / output tokens per second
    measured_s: float


def mean_step(cell: Measured, seed: int = 0) -> MeanStep:
    """The average step of ``cell``'s steady state (see the module docstring)."""
    prompt, out = lengths(cell, seed)
    p, n = prompt.astype(float), out.astype(float)
    batch = cell.avg_batch_size
    starts = batch / float(n.mean())
    decoding = batch - starts
    context = float((np.mean(p * n) + np.mean(n * (n + 1) / 2)) / n.mean())
    return MeanStep(cell, tokens=round(float(decoding + starts * p.mean())),
                    attn=decoding * context + starts * float(np.mean(p * (p + 1) / 2)),
                    kv=decoding * context + starts * float(p.mean()), sampled=round(batch),
                    decoding=decoding, context=context, measured_s=batch / cell.output_tokens_per_s)


def cost_model(cell: Measured, gpu: GPU | None = None) -> CostModel:
    """The cell's replica cost model (``gpu``: a catalog entry to use instead of the built-in one)."""
    cat = load_catalog()
    return CostModel(cat.model(cell.model), gpu or cat.gpu(cell.gpu), cell.tp, max_num_seqs=cell.max_num_seqs)


def with_terms(gpu: GPU, **terms: float) -> GPU:
    """``gpu`` with some of its float fields replaced."""
    return GPU(**{**dataclasses.asdict(gpu), **terms})


def fit_sequence_overhead(steps: Sequence[MeanStep], base: GPU) -> float:
    """Least-squares sequence overhead (microseconds, >= 0) of the relative step-time errors:
    T_i = R_i + s n_i with R_i the roofline without it."""
    free = with_terms(base, sequence_overhead_us=0.0)
    x = np.array([st.sampled / st.measured_s for st in steps])
    y = np.array([1.0 - cost_model(st.cell, free).run_step(st.tokens, st.attn, st.kv, st.sampled)[0] / st.measured_s
                  for st in steps])
    return max(0.0, float(x @ y / (x @ x))) * 1e6


def fit_power(steps: Sequence[MeanStep], base: GPU, sequence_overhead_us: float) -> tuple[float, float, float]:
    """(floor, scale, rms relative power error) of the mean steps' power against the measured
    one, the sequence overhead set: for each scale of :data:`SCALES` the floor that minimises the
    squared relative errors (power is affine in it), then the scale whose floor does best."""
    measured = np.array([st.cell.avg_power_w for st in steps])
    best = (0.0, 0.0, float("inf"))
    for k in SCALES:
        f, rms = best_floor(*[np.array([cost_model(st.cell, with_terms(
            base, sequence_overhead_us=sequence_overhead_us, memory_power_fraction=floor, compute_power_scale=k))
            .run_step(st.tokens, st.attn, st.kv, st.sampled)[1] for st in steps]) / measured for floor in FLOORS])
        if rms < best[2]:
            best = (f, k, rms)
    return best


def best_floor(at_half: np.ndarray, at_one: np.ndarray) -> tuple[float, float]:
    """(floor, rms relative error) from the power / measured ratios at floors 0.5 and 1: power is
    affine in the floor, so the least-squares floor (within (0, 1]) is in closed form."""
    slope = 2.0 * (at_one - at_half)                 # d(power / measured) / d(floor)
    at0 = at_half - 0.5 * slope
    f = float(np.clip(slope @ (1.0 - at0) / (slope @ slope), 0.01, 1.0))
    return f, float(np.sqrt(np.mean((at0 + f * slope - 1.0) ** 2)))


def simulated_power_errors(cells: Sequence[Measured], fit: Fit, seed: int = 0) -> tuple[float, float]:
    """(floor, rms) of full simulations of ``cells`` with ``fit``'s sequence overhead and scale,
    the floor solved in closed form (two simulations per cell: power is affine in the floor and
    step times do not depend on it)."""
    measured = np.array([c.avg_power_w for c in cells])
    return best_floor(*[np.array([simulate_cell(c, seed, fit=dataclasses.replace(fit, memory_power_fraction=floor))
                                  .avg_power_w for c in cells]) / measured for floor in FLOORS])


def fit_power_simulated(cells: Sequence[Measured], fit: Fit, seed: int = 0) -> Fit:
    """``fit`` with the floor and scale fitted to full simulations of ``cells`` (its sequence
    overhead kept): the scale on a coarse grid (0.05) then a fine one (0.01) around the best."""
    def rms_at(k: float) -> tuple[float, float, float]:
        f, rms = simulated_power_errors(cells, dataclasses.replace(fit, compute_power_scale=k), seed)
        return rms, f, k

    coarse = min(rms_at(round(0.05 * i, 2)) for i in range(1, 9))
    _, f, k = min(rms_at(round(coarse[2] + 0.01 * j, 2)) for j in range(-4, 5) if coarse[2] + 0.01 * j > 0.015)
    return dataclasses.replace(fit, memory_power_fraction=round(f, 2), compute_power_scale=k)


def fit_gpu(cells: Sequence[Measured], gpu: str, models: Sequence[str], seed: int = 0, simulate: bool = False) -> Fit:
    """The fitted terms of ``gpu`` from its cells of ``models``, rounded as the catalog keeps them
    (1 us, 0.01): the sequence overhead from the mean steps; the power floor and scale from the
    mean steps, or (``simulate``) from full simulations of the cells, as the catalog's are."""
    chosen = [c for c in cells if c.gpu == gpu and c.model in models]
    steps = [mean_step(c, seed) for c in chosen]
    base = load_catalog().gpu(gpu)
    s = round(fit_sequence_overhead(steps, base))
    f, k, _ = fit_power(steps, base, float(s))
    fit = Fit(gpu=gpu, models=tuple(models), sequence_overhead_us=float(s), memory_power_fraction=round(f, 2),
              compute_power_scale=k)
    return fit_power_simulated(chosen, fit, seed) if simulate else fit


def step_errors(steps: Sequence[MeanStep], gpu: GPU) -> np.ndarray:
    """Relative errors of the mean steps' predicted time against the measured one."""
    return np.array([cost_model(st.cell, gpu).run_step(st.tokens, st.attn, st.kv, st.sampled)[0] / st.measured_s - 1
                     for st in steps])


def budget_table(steps: Sequence[MeanStep], fits: dict[str, Fit]) -> str:
    """A Markdown table of each cell's measured mean step against the roofline's terms (ms): what
    it leaves out, and the sequence overhead that the fit puts there."""
    head = ("| model | GPU | tp | batch | measured step | compute | weights | KV | fixed + comm | roofline | error "
            "| sequence overhead | with it | error |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for st in steps:
        c = st.cell
        base = load_catalog().gpu(c.gpu)
        cm = cost_model(c, with_terms(base, sequence_overhead_us=0.0))
        parts = cm.step(st.tokens - round(st.decoding), st.attn - st.decoding * st.context,
                        st.kv - st.decoding * st.context, round(st.decoding), st.decoding * st.context, st.sampled)
        weights = cm.weights_read(st.tokens) / cm.bandwidth
        roof = cm.run_step(st.tokens, st.attn, st.kv, st.sampled)[0]
        fit = fits.get(c.gpu)
        s = (fit.sequence_overhead_us if fit else 0.0) * 1e-6 * st.sampled
        lines.append(f"| {c.model} | {c.gpu} | {c.tp} | {c.max_num_seqs} | {1e3 * st.measured_s:.2f} | "
                     f"{1e3 * parts.compute_s:.2f} | {1e3 * weights:.2f} | {1e3 * (parts.memory_s - weights):.2f} | "
                     f"{1e3 * (parts.overhead_s + parts.comm_s):.2f} | {1e3 * roof:.2f} | "
                     f"{roof / st.measured_s - 1:+.1%} | {1e3 * s:.2f} | {1e3 * (roof + s):.2f} | "
                     f"{(roof + s) / st.measured_s - 1:+.1%} |")
    return "\n".join(lines)


#: the batch hold-out fits on the cells of batch sizes up to this and predicts the larger ones
HOLDOUT_BATCH = 128


@dataclass(frozen=True)
class Holdout:
    """One out-of-sample check of a GPU's fit: the terms fitted on ``train`` cells alone, the
    errors measured on ``test`` cells, which the fit never saw."""

    name: str
    gpu: str
    train: tuple[Measured, ...]
    test: tuple[Measured, ...]


def holdouts(cells: Sequence[Measured], fits: dict[str, Fit]) -> list[Holdout]:
    """The hold-outs docs/fidelity.md reports, over the cells each GPU's fit uses: on a GPU fitted
    to two models, each model predicted from the other (leave one model out); on every fitted GPU,
    the batches above :data:`HOLDOUT_BATCH` predicted from those up to it (the term is a cost per
    sequence, so this is the extrapolation it must survive)."""
    out = []
    for gpu, fit in fits.items():
        mine = [c for c in cells if c.gpu == gpu and c.model in fit.models]
        if len(fit.models) > 1:
            for model in fit.models:
                out.append(Holdout(f"{gpu}: fit on the other model, predict {model}", gpu,
                                   tuple(c for c in mine if c.model != model), tuple(c for c in mine if c.model == model)))
        out.append(Holdout(f"{gpu}: fit on batches <= {HOLDOUT_BATCH}, predict the larger ones", gpu,
                           tuple(c for c in mine if c.max_num_seqs <= HOLDOUT_BATCH),
                           tuple(c for c in mine if c.max_num_seqs > HOLDOUT_BATCH)))
    return out


def fit_cells(cells: Sequence[Measured], gpu: str, with_term: bool, seed: int = 0) -> Fit:
    """The terms fitted to ``cells`` alone, the way the catalog's are (the sequence overhead from
    the mean steps, rounded to 1 us; the power floor and scale from full simulations), or without
    the sequence term (0, and the power terms fitted to the cells with it off): the two models a
    hold-out compares, each fitted to the same cells."""
    base = load_catalog().gpu(gpu)
    s = float(round(fit_sequence_overhead([mean_step(c, seed) for c in cells], base))) if with_term else 0.0
    start = Fit(gpu=gpu, models=tuple(sorted({c.model for c in cells})), sequence_overhead_us=s,
                memory_power_fraction=base.memory_power_fraction, compute_power_scale=base.compute_power_scale)
    return fit_power_simulated(cells, start, seed)
