"""Simulate a finished fidelity run's cells again with variants of its anchored profiles, against its
real figures: which model term moves which figure, without replaying anything.

benchmarks/fidelity.py keeps every real replay's figures and every calibration's profile in its JSON
(``--out``), but not the replays' rows. The simulation needs only the cell's trace, which is
deterministic (``fidelity.trace_at`` of the shape at the stored rate), and the profile: the salted
copies' prompt text reaches a simulation as request ids and prefix hashes only, which do not change
what is shared within one copy. So the run's simulated figures come back exactly (checked first: the
anchored profiles under the run's seeds must give the run's E2E p50 of every seed, to 1e-9, or the
script stops), and a variant is compared with the same real replays.

A variant here is a diagnosis, not a model: a term switched off or a reading applied shows what that
term costs on these cells; the model keeps what its probes measured (docs/fidelity.md).

    PYTHONPATH=. python benchmarks/fidelity_variants.py fidelity.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fidelity  # noqa: E402  (the benchmark's traces and settings, beside this file)

from llmlb_bench.engines.vllm import VllmSettings  # noqa: E402
from llmlb_bench.sim import ClusterConfig  # noqa: E402
from llmlb_bench.validate import BIAS_AIMS, figures  # noqa: E402

SHOWN = ("e2e_p50", "e2e_p90", "tpot_p50", "tpot_p90", "ttft_p50", "ttft_p90", "itl_p50", "itl_p90")
#: KV blocks when the run's JSON does not say (runs before 2026-12-02 18:00): more than any cell
#: here can fill, which the exact reconstruction of the run's figures confirms
PLENTY_OF_BLOCKS = 100_000


def anchored_profiles(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Each calibration's profile as the run anchored it (calibrate/anchor.py)."""
    out = []
    for cal, anchor in zip(run["calibrations"], run["anchor"]["profiles"]):
        engine = cal.get("engine") or {"max_num_seqs": fidelity.SEQS, "max_num_batched_tokens": fidelity.BUDGET,
                                       "block_size": fidelity.BLOCK, "num_kv_blocks": PLENTY_OF_BLOCKS,
                                       "max_model_len": VllmSettings().max_model_len, "enable_prefix_caching": True}
        out.append({"llmlb_profile": 2, "engine": engine, "step": anchor["step"], "jitter": anchor["jitter"],
                    "request_overhead_s": cal["request_overhead_s"],
                    "request_per_prompt_token_s": cal["request_per_prompt_token_s"],
                    "frontend_cpu_s": cal["frontend_cpu_s"] * anchor["anchor"]["scale"]})
    return out


VARIANTS: dict[str, Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]] = {
    "anchored": lambda p, cal: p,
    "arrivals' measured wait share": lambda p, cal: {**p, "frontend_wait_share": cal["frontend_wait"]["share"]},
    "no slow phases": lambda p, cal: {**p, "jitter": {**p["jitter"], "slow_rate_hz": 0.0}},
    "measured share and no slow phases": lambda p, cal: {**p, "frontend_wait_share": cal["frontend_wait"]["share"],
                                                      "jitter": {**p["jitter"], "slow_rate_hz": 0.0}},
    "frontend_cpu_s zeroed": lambda p, cal: {**p, "frontend_cpu_s": 0.0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="benchmarks/fidelity.py's JSON (--out)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    args = ap.parse_args()
    run = json.loads(args.run.read_text())
    names = [v for v in args.variants.split(",") if v]
    if set(names) - set(VARIANTS):
        ap.error(f"--variants: choose from {', '.join(VARIANTS)}")
    seeds = run["sim_seeds"]["anchored"]
    argv = run["argv"]
    seed0 = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else 0
    requests = int(argv[argv.index("--requests") + 1]) if "--requests" in argv else 150
    rows = run["cells_anchored"]
    cells = [(r["shape"], r["load"], r["rate"]) for r in rows["pooled"]]
    print("bias %, per cell " + "/".join(SHOWN) + "; then E2E/TPOT within 5% and TTFT within 10%, of 16 and 8")
    with tempfile.TemporaryDirectory(prefix="llmlb-fidelity-variants-") as tmp:
        bench = fidelity.Bench(Path(tmp), {})
        traces = {c: bench.salted(fidelity.trace_at(c[0], c[2], requests)) for c in cells}
        for v, name in enumerate(["anchored", *[n for n in names if n != "anchored"]]):
            for n, prof in enumerate(anchored_profiles(run)):
                cfg = ClusterConfig.build(replicas=1).with_profile(VARIANTS[name](prof, run["calibrations"][n]))
                line, within, ttft = [], 0, 0
                for c, cell in zip(cells, rows[f"calibration {n + 1}"]):
                    sims = [figures(bench.simulate(*traces[c], cfg, seed=seed0 + j, label=f"v{v}-{n}"))
                            for j in range(seeds[n])]
                    if name == "anchored" and not np.allclose([s["e2e_p50"] for s in sims],
                                                              cell["figures"]["e2e_p50"]["sim_s"], rtol=1e-9):
                        sys.exit(f"{c}: the anchored profile does not give the run's simulated figures back")
                    bias = {f: float(np.median([s[f] for s in sims]) / np.median(cell["figures"][f]["real_s"]) - 1)
                            for f in SHOWN}
                    within += sum(abs(bias[f]) <= BIAS_AIMS[f] for f in SHOWN[:4])
                    ttft += sum(abs(bias[f]) <= BIAS_AIMS[f] for f in SHOWN[4:6])
                    line.append("/".join(f"{100 * bias[f]:+.0f}" for f in SHOWN))
                print(f"| {name}, calibration {n + 1} | " + " | ".join(line) + f" | {within}/16 | {ttft}/8 |",
                      flush=True)


if __name__ == "__main__":
    main()
