"""The simulator's power, energy per output token and throughput against the ML.ENERGY
leaderboard v3.0 measurements (llmlb_bench/catalog/power_measurements.toml); prints the
Markdown tables that docs/simulator.md ("Energy against measurements") publishes.

    PYTHONPATH=. python benchmarks/energy_vs_measured.py                    # the catalog as it stands
    PYTHONPATH=. python benchmarks/energy_vs_measured.py --without-overhead # the model before the sequence overhead
    PYTHONPATH=. python benchmarks/energy_vs_measured.py --refit            # fit them again, and the step budget
    PYTHONPATH=. python benchmarks/energy_vs_measured.py --prompt-mean 800  # prompt-length sensitivity
    PYTHONPATH=. python benchmarks/energy_vs_measured.py --holdout          # out-of-sample errors (minutes)
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from llmlb_bench.sim import energy_fit, power_check
from llmlb_bench.sim.catalog import load_catalog


def refit(seed: int) -> None:
    """The fit from the measurements (what the [fit.<gpu>] tables should hold), per-model fits of
    the sequence overhead as a consistency check, and the mean-step budget table."""
    cells = power_check.load_measurements()
    stored = power_check.load_fits()
    fits = {}
    for gpu, fit in stored.items():
        fits[gpu] = new = energy_fit.fit_gpu(cells, gpu, fit.models, seed, simulate=True)
        print(f"[fit.{gpu}] models {list(new.models)}: sequence_overhead_us = {new.sequence_overhead_us:g}, "
              f"memory_power_fraction = {new.memory_power_fraction:g}, compute_power_scale = {new.compute_power_scale:g}"
              f"  (stored: {fit.sequence_overhead_us:g}, {fit.memory_power_fraction:g}, {fit.compute_power_scale:g})")
        base = load_catalog().gpu(gpu)
        for model in sorted({c.model for c in cells if c.gpu == gpu}):
            steps = [energy_fit.mean_step(c, seed) for c in cells if c.gpu == gpu and c.model == model]
            alone = energy_fit.fit_sequence_overhead(steps, base)
            before = energy_fit.step_errors(steps, energy_fit.with_terms(base, sequence_overhead_us=0.0))
            after = energy_fit.step_errors(steps, energy_fit.with_terms(base, sequence_overhead_us=new.sequence_overhead_us))
            print(f"  {model}: sequence overhead fitted on its cells alone {alone:.1f} us; mean-step time error "
                  f"rms {_rms(before):.1%} ({before.min():+.1%} .. {before.max():+.1%}) without, "
                  f"{_rms(after):.1%} ({after.min():+.1%} .. {after.max():+.1%}) with {new.sequence_overhead_us:g} us")
    print()
    print(energy_fit.budget_table([energy_fit.mean_step(c, seed) for c in cells], fits))


def holdout(seed: int) -> None:
    """Out-of-sample errors: each hold-out's terms fitted on its training cells alone, with and
    without the sequence term, and the errors of full simulations of the cells it held out; then
    each fitted GPU's throughput with the sequence overhead carried over from the other GPU by a
    datasheet ratio (its own power terms: only the throughput is out of sample there)."""
    cells = power_check.load_measurements()
    fits = power_check.load_fits()
    print("| hold-out | fitted / predicted cells | sequence term | terms fitted (overhead us, floor, scale) "
          "| J/token rms (range) | tokens/s rms (range) | power rms (range) |\n|---|---|---|---|---|---|---|")
    for h in energy_fit.holdouts(cells, fits):
        for with_term in (False, True):
            fit = energy_fit.fit_cells(h.train, h.gpu, with_term, seed)
            rows = power_check.compare(h.test, seed, {h.gpu: fit})
            figures = " | ".join(_spread(np.array([getattr(r, name) for r in rows]))
                                 for name in ("energy_error", "throughput_error", "power_error"))
            print(f"| {h.name} | {len(h.train)} / {len(h.test)} | {'on' if with_term else 'off'} | "
                  f"{fit.sequence_overhead_us:g}, {fit.memory_power_fraction:g}, {fit.compute_power_scale:g} | {figures} |")
    print()
    cat = load_catalog()
    for gpu, fit in fits.items():
        for other, source in fits.items():
            if other == gpu:
                continue
            chosen = [c for c in cells if c.gpu == gpu and c.model in fit.models]
            for ratio in ("hbm_gb_s", "bf16_tflops"):
                s = source.sequence_overhead_us * getattr(cat.gpu(other), ratio) / getattr(cat.gpu(gpu), ratio)
                e = np.array([power_check.simulate_cell(c, seed, fit=dataclasses.replace(fit, sequence_overhead_us=s))
                              .throughput_error for c in chosen])
                print(f"{gpu} with {other}'s {source.sequence_overhead_us:g} us x the {ratio} ratio = {s:.1f} us "
                      f"(its own fit: {fit.sequence_overhead_us:g} us): tokens/s error {_spread(e)}")


def _spread(e: np.ndarray) -> str:
    return f"{_rms(e):.1%} ({e.min():+.1%} .. {e.max():+.1%})"


def _rms(e: np.ndarray) -> float:
    return float(np.sqrt(np.mean(e ** 2)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-mean", type=float, default=power_check.PROMPT_MEAN,
                    help="mean prompt length assumed for the LMArena prompts (tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--without-overhead", action="store_true",
                    help="simulate the model before the sequence overhead was on ([fit_without_overhead.<gpu>] terms)")
    ap.add_argument("--refit", action="store_true", help="fit the terms again (the power terms by full simulations: minutes) and print the step budget")
    ap.add_argument("--holdout", action="store_true", help="fit on part of the cells, report the errors on the rest (minutes)")
    args = ap.parse_args()
    power_check.PROMPT_MEAN = args.prompt_mean
    if args.holdout:
        holdout(args.seed)
        return
    if args.refit:
        refit(args.seed)
        return
    rows = power_check.compare(power_check.load_measurements(), args.seed,
                               power_check.load_fits(table="fit_without_overhead") if args.without_overhead else None)
    print(power_check.table(rows))
    print()
    for key in sorted({(r.cell.model, r.cell.gpu) for r in rows}):
        sub = [r for r in rows if (r.cell.model, r.cell.gpu) == key]
        for name in ("power_error", "energy_error", "throughput_error"):
            e = np.array([getattr(r, name) for r in sub])
            print(f"{key[0]} {key[1]} {name}: rms {_rms(e):.1%}, range {e.min():+.1%} .. {e.max():+.1%}")


if __name__ == "__main__":
    main()
