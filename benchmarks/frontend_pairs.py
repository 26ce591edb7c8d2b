"""Do more interference pairs make ``frontend_cpu_s`` reproducible between calibrations? (issue 28)

``llmlb calibrate`` reads ``frontend_cpu_s`` as the median of its interference pairs' readings
(calibrate/fit.py ``frontend_per_arrival``), by default as many pairs as ``--repeats`` (3). This
script calibrates one vLLM CPU replica (benchmarks/fidelity.py's: core 1, this client on core 0,
the probes asking what its replays ask) ``--calibrations`` times back to back, each with
``--pairs`` interference pairs, and reads from each calibration's per-pair readings
(``fit.frontend_cpu.pairs_ms``, in the order sent) the median of its first 3 pairs (what the
default gives: the first three pairs are sent where the default sends its three), of its first
5, 7 and all. It prints, per estimator, the spread between calibrations (min, max, max/min,
range in ms) and, per calibration, the spread of its own pairs; then ``--baseline`` calibrations
with the default pairs, for the calibration's wall time with 3 pairs beside ``--pairs``.
Calibrations stop being started once ``--budget-s`` seconds would be passed (the run's whole
time, the engine's start included).

    .venv/bin/python benchmarks/frontend_pairs.py --calibrations 5 --pairs 9 --out pairs.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llmlb_bench.calibrate import calibrate
from llmlb_bench.engines.tiny_hf import word_token_ids
from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.replay import ReplayOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import BUDGET, SEQS  # noqa: E402

#: the estimators compared: the median of a calibration's first n pairs
FIRST = (3, 5, 7, 9)


def spread(values: list[float]) -> dict[str, float]:
    lo, hi = min(values), max(values)
    return {"min": lo, "max": hi, "ratio": hi / lo if lo > 0 else float("inf"), "range": hi - lo}


def sampling_sd(pairs: list[list[float]], n: int, draws: int = 2000, seed: int = 0) -> float:
    """The standard deviation a median of ``n`` pairs would have from the pairs' scatter within a
    calibration alone: each calibration's pairs resampled (with replacement, ``n`` at a time) around
    their own median, the deviations pooled over the calibrations."""
    rng = random.Random(seed)
    dev = [statistics.median(rng.choices(p, k=n)) - statistics.median(p) for p in pairs for _ in range(draws)]
    return statistics.pstdev(dev)


def table(cals: list[dict[str, Any]], first: tuple[int, ...]) -> list[str]:
    """The printed lines: per estimator its values over the calibrations, their spread and standard
    deviation beside the one the pairs' scatter within a calibration alone gives (:func:`sampling_sd`),
    then each calibration's own pairs."""
    lines = ["estimator         | per calibration (ms)           | min-max (ms) | max/min | range (ms) | "
             "sd between | sd from within"]
    pairs = [c["pairs_ms"] for c in cals]
    for n in first:
        vals = [c["medians"][str(n)] for c in cals if str(n) in c["medians"]]
        if len(vals) < 2:
            continue
        s = spread(vals)
        lines.append(f"median of {n} pairs | {', '.join(f'{v:.2f}' for v in vals):<30} | "
                     f"{s['min']:.2f}-{s['max']:.2f}    | {s['ratio']:.2f}    | {s['range']:.2f}       | "
                     f"{statistics.stdev(vals):.2f}       | {sampling_sd(pairs, n):.2f}")
    lines.append("calibration | wall s | pairs (ms, in the order sent)                     | "
                 "own min-max (ms) | load")
    for k, c in enumerate(cals):
        p = c["pairs_ms"]
        lines.append(f"{k + 1:<11} | {c['seconds']:6.0f} | {', '.join(f'{v:.1f}' for v in p):<49} | "
                     f"{min(p):.1f}-{max(p):.1f}        | {c['load_average'][0]:.2f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibrations", type=int, default=5, help="calibrations with --pairs pairs, back to back")
    ap.add_argument("--pairs", type=int, default=9, help="interference pairs of each of them")
    ap.add_argument("--baseline", type=int, default=1,
                    help="calibrations after them with the default pairs (for the wall time; their median too)")
    ap.add_argument("--repeats", type=int, default=3, help="calibrate's --repeats (the other probes)")
    ap.add_argument("--seed", type=int, default=0, help="calibration n's seed is this + n (as fidelity.py)")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="start no calibration that would end past this many seconds from the start (estimated "
                    "from the longest so far)")
    ap.add_argument("--out", type=Path, default=None, help="every figure as JSON")
    ap.add_argument("--table", type=Path, nargs="+", default=None,
                    help="print the table of earlier runs' --out files (their calibrations pooled) and stop")
    args = ap.parse_args()
    if args.table:
        runs = [json.loads(path.read_text()) for path in args.table]
        cals = [c for r in runs for c in r["calibrations"] if len(c["pairs_ms"]) >= 3]
        n_max = min(len(c["pairs_ms"]) for c in cals)
        for line in table(cals, tuple(n for n in FIRST if n < n_max) + (n_max,)):
            print(line)
        return
    if args.calibrations < 2 or args.pairs < 3:
        ap.error("--calibrations: at least 2; --pairs: at least 3")
    first = tuple(n for n in FIRST if n < args.pairs) + (args.pairs,)
    os.sched_setaffinity(0, {0})            # the client on core 0, the engine on core 1
    started = time.monotonic()
    out: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "argv": sys.argv[1:],
                           "load_average_start": os.getloadavg(), "calibrations": [], "baseline": []}

    def save() -> None:
        if args.out:
            args.out.write_text(json.dumps(out, indent=1))

    longest = 0.0
    with tempfile.TemporaryDirectory(prefix="llmlb-frontend-pairs-") as tmp:
        model = write_tiny_model(Path(tmp) / "tiny")
        # the probes ask what benchmarks/fidelity.py's replays ask (whole-word answers)
        options = ReplayOptions(api="completions", tokenize=True,
                                extra_body={"allowed_token_ids": word_token_ids(model)})
        settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)
        with VllmReplicas(model, 1, cores=[1], settings=settings) as reps:
            url = reps.urls[0]
            out["engine_ready_s"] = round(time.monotonic() - started, 1)
            runs = [("calibrations", args.pairs, n) for n in range(args.calibrations)]
            runs += [("baseline", None, args.calibrations + n) for n in range(args.baseline)]
            for kind, pairs, n in runs:
                if time.monotonic() - started + longest > args.budget_s:
                    print(f"stopping before {kind} calibration {n + 1}: --budget-s {args.budget_s:.0f} s", flush=True)
                    out["stopped_early"] = True
                    break
                t = time.monotonic()
                cal = calibrate(url, {"max_num_seqs": SEQS, "max_num_batched_tokens": BUDGET}, options=options,
                                max_prompt=2 * BUDGET, repeats=args.repeats, seed=args.seed + n,
                                interference_pairs=pairs)
                seconds = time.monotonic() - t
                longest = max(longest, seconds)
                got = cal.fit.frontend["pairs_ms"] if cal.fit.frontend else []
                one = {"seconds": round(seconds, 1), "load_average": os.getloadavg(), "pairs_sent": cal.plan.pairs,
                       "pairs_ms": got, "frontend_cpu_ms": 1e3 * cal.profile["frontend_cpu_s"],
                       "base_step_ms": 1e3 * cal.profile["step"]["base_s"],
                       "drift_sigma": cal.jitter["drift_sigma"],
                       "medians": {str(k): statistics.median(got[:k]) for k in first if len(got) >= k}}
                out[kind].append(one)
                print(f"{kind} {n + 1}: {seconds:.0f} s, {len(got)} of {cal.plan.pairs} pairs read: "
                      f"{', '.join(f'{v:.2f}' for v in got)} ms; frontend_cpu_s {one['frontend_cpu_ms']:.2f} ms; "
                      f"base step {one['base_step_ms']:.2f} ms; load {one['load_average'][0]:.2f}", flush=True)
                save()
    out["seconds"] = round(time.monotonic() - started, 1)
    out["load_average_end"] = os.getloadavg()
    cals = [c for c in out["calibrations"] if len(c["pairs_ms"]) >= 3]
    print(f"\n{out['date_utc']} UTC, load average {out['load_average_start'][0]:.2f} at the start, "
          f"{out['load_average_end'][0]:.2f} at the end; {out['seconds']:.0f} s in all "
          f"(engine ready in {out['engine_ready_s']:.0f} s)")
    for line in table(cals, first):
        print(line)
    for c in out["baseline"]:
        print(f"baseline ({c['pairs_sent']} pairs): {c['seconds']:.0f} s, pairs "
              f"{', '.join(f'{v:.1f}' for v in c['pairs_ms'])} ms, median {c['frontend_cpu_ms']:.2f} ms")
    if cals:
        walls = [c["seconds"] for c in cals]
        print(f"wall time with {args.pairs} pairs: {min(walls):.0f}-{max(walls):.0f} s"
              + ("; with the default pairs: " + ", ".join(f"{c['seconds']:.0f}" for c in out["baseline"]) + " s"
                 if out["baseline"] else ""))
    save()


if __name__ == "__main__":
    main()
