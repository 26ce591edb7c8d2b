"""A replica's step timeline, and token times and energy shares cut from it in bulk.

Every running request in decode emits one token per engine step, and a
request finishing its prefill emits its first token at the end of that step.
So a request's token times are exactly the end times of a contiguous range
of its replica's steps (several ranges if it was preempted). The replica
records its steps once, as runs of equal steps
``(first_step, start_s, gap_s, count, energy_j)``: step ``first_step + j``
ends at ``start_s + (j + 1) * gap_s`` and gives each decoding request
``energy_j`` joules. The runs are kept as five typed columns (mypyc's ``vec``,
from its runtime library ``librt``), not as a tuple per run: a run then costs no
Python object, the results batches copy the columns into NumPy as flat memory
(``vec`` has the buffer protocol), and dropping old runs moves memory instead of
freeing tuples (with tuples, converting and freeing them was a tenth of a compiled
run's time; docs/simulator.md, Speed). Compiled, appending to a ``vec`` is a few
machine instructions; ``array.array``, the columns before, boxed each value and
parsed it like an argument of a Python call (a run cost 325 ns against 35-56 ns,
a tenth of the compiled run). The ``token_times`` segments of a request are the runs
its step ranges overlap, clipped; this module computes them for many
requests at once with NumPy, so no Python code runs per token.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
from librt.vecs import append, pop, vec
from mypy_extensions import i64

from llmlb_bench.schema import TOKEN_SEGMENT

Columns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class Timeline:
    """Runs of equal steps of one replica, in step order, as the columns ``first`` (step),
    ``start`` (s), ``gap`` (s), ``count`` and ``energy`` (J per decoding request per step)."""

    __slots__ = ("first", "start", "gap", "count", "energy")

    def __init__(self) -> None:
        self.first = vec[i64]()
        self.start = vec[float]()
        self.gap = vec[float]()
        self.count = vec[i64]()
        self.energy = vec[float]()

    def __len__(self) -> int:
        return len(self.first)

    def add(self, first: int, start: float, gap: float, count: int, energy: float) -> None:
        """A new run (the run in flight): ``count`` steps from step ``first`` on, starting at ``start``."""
        self.first = append(self.first, first)
        self.start = append(self.start, start)
        self.gap = append(self.gap, gap)
        self.count = append(self.count, count)
        self.energy = append(self.energy, energy)

    def truncate_last(self, count: int) -> None:
        """The run in flight ends after ``count`` steps instead of the planned number (0: none)."""
        if count:
            self.count[len(self.count) - 1] = count
            return
        self.first = pop(self.first)[0]
        self.start = pop(self.start)[0]
        self.gap = pop(self.gap)[0]
        self.count = pop(self.count)[0]
        self.energy = pop(self.energy)[0]

    def drop_before(self, step: int) -> None:
        """Forget runs that end before ``step`` (no unfinished request needs them any more)."""
        k = self.run_of(step)
        if k > 0:
            self.first = self.first[k:]
            self.start = self.start[k:]
            self.gap = self.gap[k:]
            self.count = self.count[k:]
            self.energy = self.energy[k:]

    def run_of(self, step: int) -> int:
        """Index of the run that holds ``step``: the last one that starts at or before it (-1: none).
        A binary search of its own, since ``bisect`` takes no ``vec``."""
        first = self.first
        lo: i64 = 0
        hi = len(first)
        while lo < hi:
            mid = (lo + hi) >> 1
            if step < first[mid]:
                hi = mid
            else:
                lo = mid + 1
        return lo - 1

    def step_end(self, step: int) -> float:
        """End time of one step (the scalar twin of :func:`step_end_times`, same arithmetic)."""
        k = self.run_of(step)
        return self.start[k] + float(step - self.first[k] + 1) * self.gap[k]

    def arrays(self) -> Columns:
        """The runs as NumPy columns (copies: the timeline goes on growing)."""
        return (np.array(self.first, dtype=np.int64), np.array(self.start, dtype=np.float64),
                np.array(self.gap, dtype=np.float64), np.array(self.count, dtype=np.int64),
                np.array(self.energy, dtype=np.float64))


def runs_of(tl: Columns, steps: np.ndarray) -> np.ndarray:
    """The run that holds each step of ``steps``: a binary search over the runs' first steps, the
    costliest NumPy call of a results batch, so a batch makes it once per span end and hands the
    answer to every look-up below (``runs``; computed here when not given)."""
    out: np.ndarray = np.searchsorted(tl[0], steps, side="right") - 1
    return out


def step_end_times(tl: Columns, steps: np.ndarray, runs: np.ndarray | None = None) -> np.ndarray:
    """End time of each step in ``steps`` (of run ``runs``, see :func:`runs_of`)."""
    first, start, gap = tl[0], tl[1], tl[2]
    r = runs_of(tl, steps) if runs is None else runs
    out: np.ndarray = start[r] + (steps - first[r] + 1) * gap[r]
    return out


def summary_segments(first_s: np.ndarray, last_s: np.ndarray, count: np.ndarray, lead_s: np.ndarray) -> pa.ListArray:
    """``token_times`` of one evenly spaced segment per request over the ``count`` tokens it made
    on its last replica, from ``first_s`` to ``last_s`` (exact ends), preceded by the lead token
    made elsewhere where ``lead_s`` is not NaN."""
    has_lead = ~np.isnan(lead_s)
    gap = np.where(count > 1, (last_s - first_s) / np.maximum(count - 1, 1), 0.0)
    per_req = 1 + has_lead.astype(np.int64)
    pos = np.cumsum(per_req) - 1
    seg_start = np.empty(int(pos[-1]) + 1 if len(pos) else 0)
    seg_gap = np.zeros_like(seg_start)
    seg_count = np.ones(len(seg_start), dtype=np.int64)
    seg_start[pos], seg_gap[pos], seg_count[pos] = first_s, gap, count
    seg_start[pos[has_lead] - 1] = lead_s[has_lead]
    return list_array(per_req, seg_start, seg_gap, seg_count)


def list_array(per_req: np.ndarray, start: np.ndarray, gap: np.ndarray, count: np.ndarray) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum(per_req)]).astype(np.int32)
    segs = pa.StructArray.from_arrays(
        [pa.array(start), pa.array(gap), pa.array(count.astype(np.int32))], fields=list(TOKEN_SEGMENT))
    return pa.ListArray.from_arrays(pa.array(offsets), segs, type=pa.list_(TOKEN_SEGMENT))


def token_segments(tl: Columns, span_a: np.ndarray, span_b: np.ndarray, spans_per_request: np.ndarray,
                   lead_s: np.ndarray, runs_a: np.ndarray | None = None,
                   runs_b: np.ndarray | None = None) -> pa.ListArray:
    """``token_times`` for requests whose tokens are the step ranges ``[span_a, span_b]``.

    Spans are flat, grouped by request (``spans_per_request`` each, in time order).
    ``lead_s`` is, per request, the time of one token made elsewhere before them
    (the prefill replica's first token under disaggregation), or NaN.
    ``runs_a`` and ``runs_b``: the runs of the spans' ends (:func:`runs_of`), where known.
    Returns a ``list<TOKEN_SEGMENT>`` array, one list per request.
    """
    first, start, gap, count = tl[0], tl[1], tl[2], tl[3]
    # the runs each span overlaps: r0..r1, consecutive, so the flat run index is a ramp per span
    r0 = runs_of(tl, span_a) if runs_a is None else runs_a
    nseg = (runs_of(tl, span_b) if runs_b is None else runs_b) - r0 + 1
    head = np.cumsum(nseg) - nseg                  # each span's first segment
    run = np.arange(int(nseg.sum())) + np.repeat(r0 - head, nseg)
    run_first = first[run]
    # a segment covers its whole run, except that a span's first one starts at the span's first step
    # and its last one ends at the span's last step
    lo = run_first.copy()
    lo[head] = span_a
    hi = run_first + count[run] - 1
    hi[head + nseg - 1] = span_b
    seg_gap = gap[run]
    seg_start = start[run] + (lo - run_first + 1) * seg_gap
    seg_count = hi - lo + 1
    # segments per request = its spans' segments, plus one for a lead token
    span_req = np.repeat(np.arange(len(spans_per_request)), spans_per_request)
    per_req = np.bincount(span_req, weights=nseg, minlength=len(spans_per_request)).astype(np.int64)
    has_lead = ~np.isnan(lead_s)
    if has_lead.any():
        per_req = per_req + has_lead
        ends = np.cumsum(per_req)
        lead_pos = (ends - per_req)[has_lead]
        keep = np.ones(int(ends[-1]), dtype=bool)
        keep[lead_pos] = False
        s, g, c = (np.empty(len(keep)), np.zeros(len(keep)), np.ones(len(keep), dtype=np.int64))
        s[keep], g[keep], c[keep] = seg_start, seg_gap, seg_count
        s[lead_pos] = lead_s[has_lead]
        seg_start, seg_gap, seg_count = s, g, c
    return list_array(per_req, seg_start, seg_gap, seg_count)


def joined(timelines: Sequence[Timeline]) -> tuple[Columns, np.ndarray, np.ndarray]:
    """Several replicas' runs as one timeline, so that a results batch cuts the token times and
    energy of all their requests in one pass of NumPy calls instead of one per replica (each call's
    fixed cost, times 16 replicas, was most of a batch's cost). Step numbers are shifted so that
    each timeline's steps come after the previous one's (the first keeps its own); the arithmetic on
    them is on differences of steps within one run, so every time is what the replica's own
    timeline gives, bit for bit. Returns the columns, each timeline's shift (add it to step numbers
    on that replica) and, per run, its replica's decode shares of all steps before it (for
    :func:`decode_energy`, summed per replica, as each alone sums them)."""
    cols = [tl.arrays() for tl in timelines]
    shifts = np.zeros(len(cols), dtype=np.int64)
    end = 0
    for k, (first, _, _, count, _) in enumerate(cols):
        if k:
            shifts[k] = end - int(first[0])
        end = int(first[-1] + count[-1] + shifts[k])
    before = [np.concatenate([[0.0], np.cumsum(count[:-1] * energy[:-1])]) for _, _, _, count, energy in cols]
    if len(cols) == 1:
        return cols[0], shifts, before[0]
    first = np.concatenate([c[0] + shift for c, shift in zip(cols, shifts)])
    start, gap, count, energy = [np.concatenate([c[k] for c in cols]) for k in (1, 2, 3, 4)]
    return (first, start, gap, count, energy), shifts, np.concatenate(before)


def decode_energy(tl: Columns, before: np.ndarray, span_a: np.ndarray, span_b: np.ndarray,
                  spans_per_request: np.ndarray, runs_a: np.ndarray | None = None,
                  runs_b: np.ndarray | None = None) -> np.ndarray:
    """Per request, the decode-step energy shares over its spans, excluding each span's first
    step (the prefill step that made that token is charged through the prefill share).

    Uses the running total of shares over steps (``before``, from :func:`joined`), so each span
    costs two lookups (of the runs ``runs_a`` and ``runs_b``, :func:`runs_of`, where known)."""
    first, energy = tl[0], tl[4]

    def through(steps: np.ndarray, runs: np.ndarray | None) -> np.ndarray:
        """Total share of every step up to and including ``steps``."""
        r = runs_of(tl, steps) if runs is None else runs
        out: np.ndarray = before[r] + (steps - first[r] + 1) * energy[r]
        return out

    per_span = through(span_b, runs_b) - through(span_a, runs_a)
    span_req = np.repeat(np.arange(len(spans_per_request)), spans_per_request)
    return np.bincount(span_req, weights=per_span, minlength=len(spans_per_request))


def nth_token_times(token_times: pa.ListArray, k: np.ndarray) -> np.ndarray:
    """Per request, the time of its ``k``-th token (1-based) read off its ``token_times``; NaN where
    ``k`` < 1 or the request has fewer tokens. For reasoning requests ``k`` = reasoning + 1 gives
    the first answer token (``first_answer_s``)."""
    n = len(token_times)
    out = np.full(n, np.nan)
    k = np.asarray(k, dtype=np.int64)
    if n == 0 or not (k >= 1).any():
        return out
    offsets = np.asarray(token_times.offsets, dtype=np.int64)
    segs = token_times.values
    start = segs.field("start_s").to_numpy(zero_copy_only=False)
    gap = segs.field("gap_s").to_numpy(zero_copy_only=False)
    count = segs.field("count").to_numpy(zero_copy_only=False).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(count)])     # tokens before each segment, over all requests
    target = cum[offsets[:-1]] + k                    # the wanted token's global number
    seg = np.searchsorted(cum, target, side="left") - 1  # the segment that holds it
    found = (k >= 1) & (target <= cum[offsets[1:]])
    s = seg[found]
    out[found] = start[s] + gap[s] * (target[found] - cum[s] - 1)
    return out
