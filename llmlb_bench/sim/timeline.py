"""A replica's step timeline, and token times cut from it in bulk.

Every running request in decode emits one token per engine step, and a
request finishing its prefill emits its first token at the end of that step.
So a request's token times are exactly the end times of a contiguous range
of its replica's steps (several ranges if it was preempted). The replica
records its steps once, as runs of equal-length steps
``(first_step, start_s, gap_s, count)``: step ``first_step + j`` ends at
``start_s + (j + 1) * gap_s``. The ``token_times`` segments of a request are
the runs its step range overlaps, clipped; this module computes them for
many requests at once with NumPy, so no Python code runs per token.
"""

from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa

from llmlb_bench.schema import TOKEN_SEGMENT


class Timeline:
    """Runs of equal steps of one replica, in step order."""

    __slots__ = ("first", "start", "gap", "count")

    def __init__(self) -> None:
        self.first = array("q")
        self.start = array("d")
        self.gap = array("d")
        self.count = array("q")

    def __len__(self) -> int:
        return len(self.first)

    def append(self, first_step: int, start_s: float, gap_s: float, count: int) -> None:
        self.first.append(first_step)
        self.start.append(start_s)
        self.gap.append(gap_s)
        self.count.append(count)

    def truncate_last(self, count: int) -> None:
        """The run in flight ends after ``count`` steps instead of the planned number."""
        self.count[-1] = count

    def drop_before(self, step: int) -> None:
        """Forget runs that end before ``step`` (no unfinished request needs them any more)."""
        first = np.frombuffer(self.first, dtype=np.int64)
        k = int(np.searchsorted(first, step, side="right")) - 1
        del first
        if k > 0:
            for arr in (self.first, self.start, self.gap, self.count):
                del arr[:k]

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the four columns (copies: the live arrays keep growing)."""
        return (np.array(self.first, dtype=np.int64), np.array(self.start, dtype=np.float64),
                np.array(self.gap, dtype=np.float64), np.array(self.count, dtype=np.int64))


def step_end_times(tl: tuple[np.ndarray, ...], steps: np.ndarray) -> np.ndarray:
    """End time of each step in ``steps``."""
    first, start, gap, _ = tl
    r = np.searchsorted(first, steps, side="right") - 1
    return start[r] + (steps - first[r] + 1) * gap[r]


def token_segments(tl: tuple[np.ndarray, ...], span_a: np.ndarray, span_b: np.ndarray,
                   spans_per_request: np.ndarray) -> pa.ListArray:
    """``token_times`` for requests whose tokens are the step ranges ``[span_a, span_b]``.

    Spans are given flat, grouped by request (``spans_per_request`` of them each,
    in time order). Returns a ``list<TOKEN_SEGMENT>`` array, one list per request.
    """
    first, start, gap, count = tl
    r0 = np.searchsorted(first, span_a, side="right") - 1
    r1 = np.searchsorted(first, span_b, side="right") - 1
    nseg = r1 - r0 + 1
    total = int(nseg.sum())
    span_of_seg = np.repeat(np.arange(len(span_a)), nseg)
    within = np.arange(total) - np.repeat(np.cumsum(nseg) - nseg, nseg)
    run = r0[span_of_seg] + within
    run_first = first[run]
    lo = np.maximum(span_a[span_of_seg], run_first)
    hi = np.minimum(span_b[span_of_seg], run_first + count[run] - 1)
    seg_start = start[run] + (lo - run_first + 1) * gap[run]
    seg_count = (hi - lo + 1).astype(np.int32)
    segs = pa.StructArray.from_arrays(
        [pa.array(seg_start), pa.array(gap[run]), pa.array(seg_count)], fields=list(TOKEN_SEGMENT))
    # segments per request = sum of its spans' segment counts
    span_ends = np.cumsum(spans_per_request)
    seg_ends = np.cumsum(nseg)[span_ends - 1] if len(span_ends) else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], seg_ends]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), segs, type=pa.list_(TOKEN_SEGMENT))
