"""One result row per trace row: its values from the trace's columns and, for a request that left
for an endpoint, from its :class:`~llmlb_bench.replay.flight.Flight`; counted by status.

The values follow :data:`llmlb_bench.replay.rows.SCALARS`; times are on the run clock (seconds
since trace time 0, the row buffer's ``origin``) and token segments are handed over as the clock
read them (the writer thread shifts them).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import pyarrow as pa

from llmlb_bench.replay.flight import Flight
from llmlb_bench.replay.rows import RowWriter, write_table
from llmlb_bench.trace_columns import TraceColumns


class ResultRows:
    """The result rows of the trace ``tr`` (``sched``: each row's scheduled time; ``names``: the
    endpoints, by target index), into ``writer``; ``status`` counts the rows written by status."""

    def __init__(self, tr: TraceColumns, sched: Sequence[float], names: list[str], writer: RowWriter) -> None:
        self.tr = tr
        self.sched = sched
        self.names = names
        self.writer = writer
        self.status = Counter[str]()

    def write(self, idx: int, f: Flight | None, status: str, error: str | None) -> None:
        """Row ``idx``'s result: ``f`` is None for a request that never left for an endpoint."""
        tr, t0 = self.tr, self.writer.buffer.origin
        self.status[status] += 1
        if f is None:
            values: tuple[object, ...] = (tr.rid[idx], tr.tenant[idx], tr.slo[idx], tr.session[idx], tr.turn[idx], None,
                      self.sched[idx], None, None, None,
                      tr.inp[idx], tr.out[idx], None, None, status, error, None, None, None, None, tr.adapter[idx], None, None, None)
            self.writer.buffer.add(values, None, None)
        else:
            out, estimated = f.output_tokens()
            reasoning = f.reasoning_tokens()
            values = (tr.rid[idx], tr.tenant[idx], tr.slo[idx], tr.session[idx], tr.turn[idx],
                      self.names[f.target], f.scheduled_s,
                      None if f.sent is None else f.sent - t0,
                      None if f.first is None else f.first - t0,
                      None if f.last is None else f.last - t0,
                      tr.inp[idx], tr.out[idx], out if f.sent is not None else None, f.cached, status,
                      error, f.http_status, f.usage_in, estimated if f.sent is not None else None, f.backend,
                      tr.adapter[idx], f.route.predicted_cached_tokens,
                      reasoning, None if reasoning is None or f.answer_at is None else f.answer_at - t0)
            self.writer.buffer.add(values, f.seg_start, f.seg_count)
        if self.writer.due():
            self.writer.submit()

    def carry(self, rows: pa.Table) -> None:
        """A resumed run's rows from before (written as they are, counted by status)."""
        write_table(self.writer.sink, rows)
        self.status.update(rows.column("status").to_pylist())
