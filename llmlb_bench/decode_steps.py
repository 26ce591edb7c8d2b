"""The engine's decode steps by batch size, read from a run's streamed tokens, real or simulated alike.

Why ``llmlb validate`` shows them: when the simulated latencies miss the real ones, the first question
is whether the step model is wrong (each step takes another time than the profile says at that
batch) or something around it is (queueing, admission, the frontend's per-request work). A step's
length cannot be read from one request's token gaps (they change with whoever shares the step), but
all of a run's requests together give the engine's step series (:func:`calibrate.fit.step_reads`,
the reading ``llmlb calibrate`` fits its decode probes with), and the requests decoding through each
step give its batch. The simulated runs are read by the same code, so what the reading cannot resolve
(bundled reads, a step whose tokens nobody streamed) it misses on both sides alike.

A *decode step* here is one during which at least one request decodes from before its start to after
its end and in which no request got its first token (so no prefill chunk shares it); its length per
token is its span over the most tokens any request read at its end (a server that bundles k steps into
one read shows k tokens). On the H200 run of docs/fidelity-runs.md this table would have shown at once what
a day of reading runs found: steps at batch 1-2 as calibrated, at 3-64 two to three times longer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from llmlb_bench.schema import ArrowRow

#: batch-size buckets (requests decoding through a step), both bounds included; None: no upper bound
BUCKETS: tuple[tuple[int, int | None], ...] = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, None))
#: streamed reads a run is read for at most (from its start): the grouping is a Python loop over reads,
#: so a production-sized replay is read over its first part, not whole
READ_LIMIT = 200_000
#: steps a bucket needs on both sides to be compared
MIN_STEPS = 5


def bucket_name(lo: int, hi: int | None) -> str:
    return str(lo) if hi == lo else f"{lo}-{hi}" if hi is not None else f"{lo}+"


def decode_steps(rows: Sequence[ArrowRow]) -> tuple[np.ndarray, np.ndarray]:
    """Each decode step's length per token (s) and its batch (requests decoding through it), in time
    order; empty arrays when the run streamed too little to tell steps apart."""
    from llmlb_bench.calibrate.fit import step_reads
    from llmlb_bench.calibrate.probes import token_times

    ok = [r for r in rows if r["status"] == "ok" and r["first_token_s"] is not None]
    spans = [t for t in map(token_times, ok) if t.size]
    none = (np.zeros(0), np.zeros(0, dtype=np.int64))
    if not spans:
        return none
    reads = np.sort(np.concatenate(spans))
    until = float(reads[READ_LIMIT - 1]) if reads.size > READ_LIMIT else math.inf
    at, counts = step_reads(ok, -math.inf, until)
    if at.size < 2:
        return none
    first = np.array([t[0] for t in spans])
    last = np.array([t[-1] for t in spans])
    lo, hi = at[:-1], at[1:]
    # decoding through step j = [at[j], at[j+1]]: first <= lo and last >= hi. Counted as those started
    # by lo, less those of them that ended before hi: every request that ended before hi, less the
    # ones that started after lo (first and last inside the same step, a request of one read group)
    step_of_first = np.searchsorted(at, first, side="right") - 1
    step_of_last = np.searchsorted(at, last, side="right") - 1
    inside = (step_of_first == step_of_last) & (first > at[np.maximum(step_of_first, 0)]) & (step_of_first >= 0)
    inside_per_step = np.bincount(step_of_first[inside], minlength=at.size)[:lo.size]
    started = np.searchsorted(np.sort(first), lo, side="right")
    ended = np.searchsorted(np.sort(last), hi, side="left") - inside_per_step
    batch = started - ended
    # the step before the read group holding a request's first token computed its prefill
    prefill = np.zeros(lo.size, dtype=bool)
    grouped = step_of_first[(step_of_first >= 1) & (step_of_first <= lo.size)]
    prefill[grouped - 1] = True
    keep = (batch > 0) & ~prefill
    return ((hi - lo) / counts[1:])[keep], batch[keep]


@dataclass(frozen=True)
class BucketSteps:
    """One batch bucket's decode steps over a side's runs, pooled."""

    batch: str
    real_s: float            # median step length per token, NaN where fewer than MIN_STEPS
    sim_s: float
    real_steps: int
    sim_steps: int

    @property
    def ratio(self) -> float:
        """Simulated over real median, minus 1 (NaN where either side has too few steps)."""
        return self.sim_s / self.real_s - 1 if self.real_s > 0 and math.isfinite(self.sim_s) else math.nan


def by_batch(real_runs: Sequence[Sequence[ArrowRow]], sim_runs: Sequence[Sequence[ArrowRow]]) -> list[BucketSteps]:
    """The median decode step per batch bucket on both sides (each side's runs pooled); only buckets
    with :data:`MIN_STEPS` steps on at least one side."""
    sides = []
    for runs in (real_runs, sim_runs):
        read = [decode_steps(rows) for rows in runs]
        gaps = np.concatenate([g for g, _ in read]) if read else np.zeros(0)
        batches = np.concatenate([b for _, b in read]) if read else np.zeros(0, dtype=np.int64)
        sides.append((gaps, batches))
    out = []
    for lo, hi in BUCKETS:
        medians, counts = [], []
        for gaps, batches in sides:
            sel = gaps[(batches >= lo) & (batches <= (hi if hi is not None else np.iinfo(np.int64).max))]
            counts.append(int(sel.size))
            medians.append(float(np.median(sel)) if sel.size >= MIN_STEPS else math.nan)
        if max(counts) >= MIN_STEPS:
            out.append(BucketSteps(bucket_name(lo, hi), medians[0], medians[1], counts[0], counts[1]))
    return out
