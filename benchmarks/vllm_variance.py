"""Where does vLLM CPU's run-to-run variance come from? Bounded experiments on one replica.

The same trace replayed against the same vLLM CPU replica differs from replay to replay (TTFT
p50 by 34%, TPOT p50 by 77% over three replays on a quiet machine: issue 28). This script
replays one Poisson trace many times against one replica (pinned to core 1, this client on
core 0; ``--same-core`` puts the client on the engine's core) under conditions that are
interleaved round by round, so a slow spell of the machine hits every condition alike:

* ``cold``: the very first replay after the engine started (no warm-up: the short trace), against
  the later replays of the same trace;
* ``short`` / ``long``: the trace's first ``--short`` requests, against all ``--requests``
  (does a longer trace average the engine's slow phases out?);
* ``gc-off``: the client's Python garbage collector frozen and disabled during the replay
  (``gc.freeze(); gc.disable()``), against the ordinary client (``short`` is its twin);
* ``same-core``: the client moved onto the engine's core for the replay (``short`` is its twin:
  the client on the other core).

Per condition: TTFT / TPOT / E2E p50 and p90 of every replay, their coefficient of variation
and max/min - 1 over the repeats, and the load average beside each replay (the machine's other
work is the one cause no setting here removes). Figures as JSON with ``--out``.

    flock /tmp/llmlb-measure.lock .venv/bin/python benchmarks/vllm_variance.py --rounds 4 --out var.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.validate import figures

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import BUDGET, SEQS, Bench, trace_at  # noqa: E402

KEYS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90")


def spread(values: list[float]) -> dict[str, float]:
    v = np.array(values)
    return {"cv_pct": round(100 * float(np.std(v, ddof=1) / np.mean(v)), 1) if v.size > 1 else float("nan"),
            "max_over_min_pct": round(100 * float(v.max() / v.min() - 1), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4, help="replays of each condition (interleaved)")
    ap.add_argument("--requests", type=int, default=240, help="the long trace's requests")
    ap.add_argument("--short", type=int, default=80, help="the short trace's requests")
    ap.add_argument("--rate", type=float, default=10.0, help="arrival rate, requests/s (a third of the replica's "
                    "capacity on a quiet machine, about 30 req/s on these traces)")
    ap.add_argument("--conditions", default="short,long,gc-off",
                    help="conditions replayed each round (short, long, gc-off, same-core)")
    ap.add_argument("--frontend-core", type=int, default=None,
                    help="run the engine's API server and engine-core process on this core (default: all three "
                    "vLLM processes on the engine's core 1; 0 shares the client's core)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    conditions = [c for c in args.conditions.split(",") if c]
    if set(conditions) - {"short", "long", "gc-off", "same-core"}:
        ap.error("--conditions: choose from short, long, gc-off, same-core")
    os.sched_setaffinity(0, {0})
    out: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "argv": sys.argv[1:],
                           "load_average_start": os.getloadavg(), "replays": []}
    with tempfile.TemporaryDirectory(prefix="llmlb-variance-") as tmp:
        work = Path(tmp)
        model = write_tiny_model(work / "tiny")
        bench = Bench(work, {})
        frontend = [[args.frontend_core]] if args.frontend_core is not None else None
        with VllmReplicas(model, 1, cores=[1], frontend_cores=frontend,
                          settings=VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)) as reps:
            url = reps.urls[0]

            def one(cond: str) -> None:
                trace = trace_at("poisson", args.rate, args.requests if cond == "long" else args.short)
                table, path = bench.salted(trace)
                if cond == "gc-off":
                    gc.collect()
                    gc.freeze()
                    gc.disable()
                if cond == "same-core":
                    os.sched_setaffinity(0, {1})
                t0, load = time.time(), os.getloadavg()[0]
                try:
                    rows = bench.replay(table, path, [url])
                finally:
                    if cond == "gc-off":
                        gc.enable()
                        gc.unfreeze()
                    os.sched_setaffinity(0, {0})
                f = figures(rows)
                rec = {"condition": cond, "seconds": round(time.time() - t0, 1), "load_average": load,
                       **{k: round(1e3 * f[k], 2) for k in KEYS}}
                out["replays"].append(rec)
                print(json.dumps(rec), flush=True)
                if args.out:
                    args.out.write_text(json.dumps(out, indent=1))

            one("cold")
            for _ in range(args.rounds):
                for cond in conditions:
                    one(cond)
    out["load_average_end"] = os.getloadavg()
    out["summary"] = {}
    for cond in ("short", "long", "gc-off", "same-core"):
        reps_ = [r for r in out["replays"] if r["condition"] == cond]
        if len(reps_) > 1:
            out["summary"][cond] = {k: spread([r[k] for r in reps_]) for k in KEYS}
            out["summary"][cond]["load_average"] = [r["load_average"] for r in reps_]
    cold = out["replays"][0]
    warm_short = [r for r in out["replays"] if r["condition"] == "short"]
    if warm_short:
        out["summary"]["cold_over_warm_median_pct"] = {
            k: round(100 * (cold[k] / float(np.median([r[k] for r in warm_short])) - 1), 1) for k in KEYS}
    print(json.dumps(out["summary"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
