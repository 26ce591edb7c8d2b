"""Print how close the simulator's cost model is to measured layer timings, before and after fitting its efficiency factors.

    python benchmarks/sim_cost_fit.py [PROFILES_ROOT]

PROFILES_ROOT defaults to ../shared/data/profiles/vidur (Vidur's compute profiles:
compute/<gpu>/<org>/<model>/mlp.csv). Prints the fitted factors per GPU and a Markdown
table of errors (the one in docs/simulator.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from llmlb_bench.sim import load_catalog
from llmlb_bench.sim.cost_fit import (error_table, find_vidur_all_reduce, find_vidur_profiles, fit_all_reduce,
                                        fit_efficiency, predict_all_reduce)

ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "profiles" / "vidur"


def main(root: Path) -> None:
    profiles = find_vidur_profiles(root)
    if not profiles:
        sys.exit(f"{root}: no Vidur compute profiles found")
    cat = load_catalog()
    fits = {}
    a100 = [p for p in profiles if p.gpu == "a100-80g"]
    if a100:
        fits["a100-80g"] = fit_efficiency(a100)
    h100 = [p for p in profiles if p.gpu == "h100-sxm"]
    if h100:
        held = {"memory_efficiency": fits["a100-80g"].memory_efficiency} if "a100-80g" in fits else {
            "layer_latency_us": cat.gpus["h100-sxm"].layer_latency_us}
        fits["h100-sxm"] = fit_efficiency(h100, held)
    for gpu, fit in fits.items():
        g = cat.gpus[gpu]
        print(f"{gpu}: fitted compute_efficiency {fit.compute_efficiency}, memory_efficiency "
              f"{fit.memory_efficiency}, layer_latency_us {fit.layer_latency_us:g} over {fit.rows} rows "
              f"(catalog: {g.compute_efficiency}, {g.memory_efficiency}, {g.layer_latency_us:g})")
    print()
    print("| GPU | model | setting | mean error | p90 error | <= 256 tokens | > 256 tokens |")
    print("|---|---|---|---|---|---|---|")
    for gpu, fit in fits.items():
        settings = {"datasheet roofline": (1.0, 1.0, 0.0), "calibrated": fit.factors}
        for r in error_table([p for p in profiles if p.gpu == gpu], settings):
            print(f"| {r['gpu']} | {r['model']} | {r['setting']} | {r['mean_pct']:.1f}% | {r['p90_pct']:.1f}% "
                  f"| {r['small_batch_pct']:.1f}% | {r['large_batch_pct']:.1f}% |")


    print()
    print("| GPU | all-reduce fit | error with datasheet bandwidth | fitted error (mean / p90) |")
    print("|---|---|---|---|")
    datasheet = {"a100-80g": 300.0, "h100-sxm": 450.0}
    for p in find_vidur_all_reduce(root):
        lat, bw = fit_all_reduce(p)
        before = abs(predict_all_reduce(p, lat, datasheet[p.gpu]) / p.seconds - 1)
        after = abs(predict_all_reduce(p, lat, bw) / p.seconds - 1)
        print(f"| {p.gpu} | {lat:g} us + message / {bw:g} GB/s | {100 * before.mean():.1f}% "
              f"| {100 * after.mean():.1f}% / {100 * sorted(after)[int(0.9 * len(after))]:.1f}% |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
