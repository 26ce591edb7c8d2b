"""How much does one calibration of one vLLM CPU replica differ from the next? (issue 28)

``llmlb calibrate`` fits a step model to probes of a live engine; a simulation is only as good
as that one profile. This script calibrates the same replica ``--calibrations`` times in a row and,
after each, simulates and replays the same Poisson and multi-turn traces once (fresh prompt text
per replay, benchmarks/fidelity.py's ``Bench``), so the spread of the fitted terms and of the
simulated/real ratios over calibrations can be read beside the engine's own replay-to-replay
spread. The replica runs on core 1, this client on core 0; run it on a quiet machine.

    .venv/bin/python benchmarks/calibration_noise.py --calibrations 5 --out calnoise.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from llmlb_bench.calibrate import calibrate
from llmlb_bench.engines.tiny_hf import word_token_ids
from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.validate import figures

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import BUDGET, SEQS, Bench, trace_at  # noqa: E402

#: the traces' rates, requests/s: about 60% of this replica's capacity on a quiet machine
RATES = {"poisson": 15.0, "multiturn": 11.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibrations", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3, help="calibrate's --repeats")
    ap.add_argument("--requests", type=int, default=150, help="requests per trace")
    ap.add_argument("--out", type=Path, default=None, help="every figure as JSON")
    args = ap.parse_args()
    os.sched_setaffinity(0, {0})
    out: dict[str, Any] = {"load_average_start": os.getloadavg(), "argv": sys.argv[1:], "calibrations": []}
    with tempfile.TemporaryDirectory(prefix="llmlb-calnoise-") as tmp:
        work = Path(tmp)
        model = write_tiny_model(work / "tiny")
        bench = Bench(work, {"allowed_token_ids": word_token_ids(model)})
        settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)
        traces = {shape: trace_at(shape, rate, args.requests) for shape, rate in RATES.items()}
        with VllmReplicas(model, 1, cores=[1], settings=settings) as reps:
            url = reps.urls[0]
            for k in range(args.calibrations):
                profile = calibrate(url, {"max_num_seqs": SEQS, "max_num_batched_tokens": BUDGET},
                                    options=ReplayOptions(api="completions", tokenize=True), max_prompt=2 * BUDGET,
                                    repeats=args.repeats).profile
                cfg = ClusterConfig.build(replicas=1).with_profile(profile)
                one: dict[str, Any] = {"step": profile["step"], "request_overhead_s": profile["request_overhead_s"],
                                       "request_per_prompt_token_s": profile["request_per_prompt_token_s"],
                                       "jitter": profile["jitter"], "fit": profile["fit"]["by_probe"],
                                       "load_average": os.getloadavg()[0]}
                for shape, trace in traces.items():
                    table, path = bench.salted(trace)
                    sim = figures(bench.simulate(table, path, cfg, seed=0))
                    real = figures(bench.replay(table, path, [url]))
                    one[shape] = {"sim": sim, "real": real,
                                  "e2e_p50_bias_pct": round(100 * (sim["e2e_p50"] / real["e2e_p50"] - 1), 1),
                                  "tpot_p50_bias_pct": round(100 * (sim["tpot_p50"] / real["tpot_p50"] - 1), 1)}
                out["calibrations"].append(one)
                step = profile["step"]
                print(f"calibration {k + 1}: per-token {1e6 * step['per_token_s']:.1f} us, per-prompt-token overhead "
                      f"{1e6 * profile['request_per_prompt_token_s']:.1f} us, base {1e3 * step['base_s']:.2f} ms, "
                      f"drift log sd {profile['jitter']['drift_sigma']:.3f} over {profile['jitter']['drift_period_s']:.3g} s; "
                      + "; ".join(f"{s} E2E p50 sim/real {one[s]['e2e_p50_bias_pct']:+.1f}%" for s in traces)
                      + f"; load {one['load_average']:.2f}", flush=True)
                if args.out:
                    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
