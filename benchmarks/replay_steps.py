"""The engine's steps inside a kept fidelity run's replays, against the simulator's, read alike.

The question left by issue 28's slow-phase work (docs/fidelity-runs.md): the decode probes of
``llmlb calibrate`` see 1.6x slow steps 20-47 times per second, and the simulator draws them in
every cell, but do the replays' steps show them? One request's own gaps cannot say (they change
with its batch and the prefills beside it). All of a replay's requests together can: every running
request gets a token in each engine step, so pooling every request's streamed reads gives the
engine's step series (calibrate/fit.py ``step_reads``, the reading calibrate uses for its decode
windows). The simulated runs of the same trace copies are read by the same code, so whatever the
reading cannot resolve it misses on both sides alike.

Per run, over the steps while at least one request was decoding through the whole step (an
engine with nothing to do is not slow):

* ``decode``: steps in which no request got its first token (no prefill ended there);
* each such step against the running median of its ``--window`` decode neighbours on either side
  (a batch changes slowly, a slow phase does not); a step above ``--slow`` x that median is slow,
  consecutive slow steps one phase;
* steps per second of busy time; the mean length of the steps that sampled some request's first
  token (a prefill chunk beside the decoding batch: the steps a queue waits behind) and their share
  of busy time, and the mean length of the other (decode) steps;
* the decode steps' gap p50 / p90 / p99 (ms), slow phases per second of busy
  time, the time they add over their neighbours' median as a share of busy time, and their
  factor (their time over their neighbours' median);
* the decode steps' mean over the median of the ordinary (not slow) ones: all that slows the
  typical step, however the slow steps are counted; over all steps, and apart for the steps
  NEAR an arrival (some request sent and still waiting for its first token: the frontend
  tokenising it, the per-arrival ``frontend_cpu_s``) and FAR from one (only the frontend's
  background turns: what the probes' slow phases describe), with the near steps' share of
  decode time;
* the ordinary decode steps' median, over all and by batch (requests decoding through the
  step): where the step model's typical step is off, at the replays' own batches.

Per cell, real (the K replays) against every simulated variant kept in the run (the same copies;
pooled over the calibrations): median over the runs [min - max].

Each run is read with a steps x requests table (who decodes through each step, who waits for a
first token): sized for the fidelity benchmark's runs (150 requests, a few thousand steps), not
for replays of a production trace.

    PYTHONPATH=. python benchmarks/fidelity.py ... --keep kept --out fidelity.json
    PYTHONPATH=. python benchmarks/replay_steps.py fidelity.json kept
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from scipy.ndimage import median_filter

from llmlb_bench.calibrate.fit import step_reads
from llmlb_bench.calibrate.probes import token_times
from llmlb_bench.schema import ArrowRow

#: batch sizes (requests decoding through a step) whose ordinary steps' median is shown apart
BATCHES = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 1 << 30))
FIGURES = ("steps_per_s", "first_token_step_ms", "first_token_share", "decode_step_ms", "gap_p50_ms", "gap_p90_ms", "gap_p99_ms", "slow_per_s", "slow_extra_share", "slow_factor",
           "mean_over_ordinary", "near_share", "near_mean_over_ordinary", "far_mean_over_ordinary", "ordinary_p50_ms", *(f"ordinary_p50_ms_b{lo}" + (f"-{hi}" if hi != lo and hi < 1 << 30 else "+" * (hi > lo))
                                for lo, hi in BATCHES))


def step_figures(rows: list[ArrowRow], slow: float, window: int) -> dict[str, float]:
    """One run's step figures (see the module docstring); NaN where it has too few decode steps."""
    ok = [r for r in rows if r["status"] == "ok" and r["first_token_s"] is not None]
    at, counts = step_reads(ok, -math.inf, math.inf)
    nan = {k: math.nan for k in FIGURES}
    if at.size < 2 * window + 2:
        return nan
    spans = [token_times(r) for r in ok]
    first = np.array([t[0] for t in spans if t.size])
    last = np.array([t[-1] for t in spans if t.size])
    sent = np.array([r["sent_s"] for r, t in zip(ok, spans) if t.size])
    lo, hi = at[:-1], at[1:]
    # busy: some request decoding through the whole step (its first token at or before the step's
    # start, its last at or after its end)
    decoding = ((first[None, :] <= lo[:, None]) & (last[None, :] >= hi[:, None])).sum(axis=1)
    busy = decoding > 0
    prefill = np.zeros(hi.size, dtype=bool)
    ended = np.searchsorted(at, first, side="right") - 1         # the step whose read group holds a first token
    prefill[ended[(ended >= 1)] - 1] = True
    gaps = (hi - lo) / counts[1:]
    span = hi - lo
    busy_s = float(span[busy].sum())
    decode = gaps[busy & ~prefill]
    batch = decoding[busy & ~prefill]
    # near an arrival: some request sent and still waiting for its first token during the step
    near = ((sent[None, :] < hi[:, None]) & (first[None, :] > lo[:, None])).any(axis=1)[busy & ~prefill]
    if decode.size < 2 * window + 2 or busy_s <= 0:
        return nan
    local = median_filter(decode, size=2 * window + 1, mode="nearest")
    is_slow = decode > slow * local
    phases = int(np.count_nonzero(is_slow[1:] & ~is_slow[:-1]) + is_slow[0])
    by_batch = {name: 1e3 * float(np.median(decode[~is_slow & (batch >= b0) & (batch <= b1)]))
                if np.any(~is_slow & (batch >= b0) & (batch <= b1)) else math.nan
                for name, (b0, b1) in zip(FIGURES[-len(BATCHES):], BATCHES)}
    return {"steps_per_s": float(busy.sum()) / busy_s,
            "first_token_step_ms": 1e3 * float(span[busy & prefill].mean()) if np.any(busy & prefill) else math.nan,
            "first_token_share": float(span[busy & prefill].sum()) / busy_s,
            "decode_step_ms": 1e3 * float(span[busy & ~prefill].mean()),
            "gap_p50_ms": 1e3 * float(np.percentile(decode, 50)),
            "gap_p90_ms": 1e3 * float(np.percentile(decode, 90)),
            "gap_p99_ms": 1e3 * float(np.percentile(decode, 99)),
            "slow_per_s": phases / busy_s,
            "slow_extra_share": float((decode - local)[is_slow].sum()) / busy_s,
            "slow_factor": float(decode[is_slow].sum() / local[is_slow].sum()) if phases else math.nan,
            "mean_over_ordinary": excess(decode, is_slow, np.ones_like(near)),
            "near_share": float(decode[near].sum() / decode.sum()),
            "near_mean_over_ordinary": excess(decode, is_slow, near),
            "far_mean_over_ordinary": excess(decode, is_slow, ~near),
            "ordinary_p50_ms": 1e3 * float(np.median(decode[~is_slow])), **by_batch}


def excess(decode: np.ndarray, is_slow: np.ndarray, where: np.ndarray) -> float:
    """The selected decode steps' mean over the median of their ordinary (not slow) ones: what
    every slowing (slow phases, the frontend's stalls) adds to the typical step, in one figure
    that does not depend on how the slow steps are counted."""
    ordinary = decode[where & ~is_slow]
    return float(decode[where].mean() / np.median(ordinary)) if ordinary.size else math.nan


def rows_of(run_dir: Path) -> list[ArrowRow]:
    rows: list[ArrowRow] = pq.read_table(run_dir / "requests.parquet").to_pylist()
    return rows


def spread(values: list[float]) -> dict[str, float]:
    v = np.array([x for x in values if not math.isnan(x)])
    if not v.size:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "runs": 0}
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()), "runs": int(v.size)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="the fidelity run's JSON (benchmarks/fidelity.py --out)")
    ap.add_argument("kept", type=Path, help="its kept work folder (benchmarks/fidelity.py --keep)")
    ap.add_argument("--slow", type=float, default=1.5, help="a step this many times its neighbours' median is slow")
    ap.add_argument("--window", type=int, default=8, help="decode neighbours on either side of a step")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    run = json.loads(args.run.read_text())
    if "traces" not in run:
        sys.exit(f"{args.run}: no 'traces' (a run of benchmarks/fidelity.py before --keep); rerun it with --keep")
    runs = args.kept / "runs"
    variants = list(run["sim_seeds"])
    out: dict[str, Any] = {"slow": args.slow, "window": args.window, "cells": {}}
    for cell, stems in run["traces"].items():
        sides: dict[str, list[dict[str, float]]] = {
            "real": [step_figures(rows_of(runs / f"{s}-real-round_robin"), args.slow, args.window) for s in stems]}
        for name in variants:
            dirs = sorted(d for s in stems for n in range(len(run["sim_seeds"][name]))
                          for d in runs.glob(f"{s}-{name}-{n}-round_robin-*"))
            sides[name] = [step_figures(rows_of(d), args.slow, args.window) for d in dirs]
        out["cells"][cell] = {side: {k: spread([f[k] for f in figs]) for k in FIGURES} for side, figs in sides.items()}
        print(f"{cell}:")
        for side, figs in out["cells"][cell].items():
            print(f"  {side:36s} " + "  ".join(
                f"{k} {f['median']:.3g} [{f['min']:.3g}-{f['max']:.3g}]" for k, f in figs.items()), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
