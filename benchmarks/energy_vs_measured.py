"""The simulator's power and energy per output token against the ML.ENERGY leaderboard v3.0
measurements (llmlb_bench/catalog/power_measurements.toml); prints the Markdown table that
docs/simulator.md ("Energy against measurements") publishes.

    PYTHONPATH=. python benchmarks/energy_vs_measured.py                    # the table
    PYTHONPATH=. python benchmarks/energy_vs_measured.py --prompt-mean 800  # prompt-length sensitivity
"""

from __future__ import annotations

import argparse

import numpy as np

from llmlb_bench.sim import power_check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-mean", type=float, default=power_check.PROMPT_MEAN,
                    help="mean prompt length assumed for the LMArena prompts (tokens)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    power_check.PROMPT_MEAN = args.prompt_mean
    rows = power_check.compare(power_check.load_measurements(), args.seed)
    print(power_check.table(rows))
    print()
    for key in sorted({(r.cell.model, r.cell.gpu) for r in rows}):
        sub = [r for r in rows if (r.cell.model, r.cell.gpu) == key]
        for name in ("power_error", "energy_error", "throughput_error"):
            e = np.array([getattr(r, name) for r in sub])
            print(f"{key[0]} {key[1]} {name}: rms {np.sqrt(np.mean(e ** 2)):.1%}, range {e.min():+.1%} .. {e.max():+.1%}")


if __name__ == "__main__":
    main()
