"""Collect finished requests and write them to the run's requests sink in batches.

A finished request is remembered as a few integers (its trace row, its token
step ranges); its times and ``token_times`` segments are computed in bulk from
its replica's timeline when a batch is written, and the timelines are then
trimmed to what unfinished requests still need.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from llmlb_bench.schema import TOKEN_SEGMENT
from llmlb_bench.sim.replica import Replica, Request
from llmlb_bench.sim.timeline import step_end_times, token_segments


class _Finished:
    """Buffered finished requests of one replica."""

    __slots__ = ("rows", "span_a", "span_b", "nspans", "preemptions", "cached")

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.span_a: list[int] = []
        self.span_b: list[int] = []
        self.nspans: list[int] = []
        self.preemptions: list[int] = []
        self.cached: list[int] = []


class RequestRecorder:
    """Turns finished and rejected requests into REQUESTS rows."""

    def __init__(self, trace: pa.Table, sink: Any, replicas: Sequence[Replica], sent_s: np.ndarray,
                 batch_rows: int = 50_000) -> None:
        self.sink = sink
        self.replicas = replicas
        self.sent_s = sent_s
        self.batch_rows = batch_rows
        self._trace = trace.select(["request_id", "tenant", "slo_class", "input_tokens", "output_tokens"])
        self._finished = [_Finished() for _ in replicas]
        self._rejected_rows: list[int] = []
        self._rejected_target: list[str] = []
        self._rejected_error: list[str] = []
        self.pending = 0
        self.ok = 0
        self.rejected = 0

    def finished(self, replica: int, req: Request) -> None:
        f = self._finished[replica]
        f.rows.append(req.row)
        spans = req.spans
        for a, b in spans:
            f.span_a.append(a)
            f.span_b.append(b)
        f.nspans.append(len(spans))
        f.preemptions.append(req.preemptions)
        f.cached.append(req.cached)
        self.ok += 1
        self.pending += 1
        if self.pending >= self.batch_rows:
            self.flush()

    def reject(self, row: int, target: str, error: str) -> None:
        self._rejected_rows.append(row)
        self._rejected_target.append(target)
        self._rejected_error.append(error)
        self.rejected += 1
        self.pending += 1
        if self.pending >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        parts: list[dict[str, Any]] = []
        for rep, f in zip(self.replicas, self._finished):
            if f.rows:
                parts.append(self._finished_columns(rep, f))
                self._finished[rep.index] = _Finished()
            rep.timeline.drop_before(rep.oldest_needed_step())
        if self._rejected_rows:
            n = len(self._rejected_rows)
            parts.append({
                "rows": np.array(self._rejected_rows, dtype=np.int64),
                "target": pa.array(self._rejected_target, pa.string()),
                "first_token_s": pa.nulls(n, pa.float64()),
                "last_token_s": pa.nulls(n, pa.float64()),
                "token_times": pa.nulls(n, pa.list_(TOKEN_SEGMENT)),
                "output_tokens": np.zeros(n, dtype=np.int32),
                "cached_tokens": np.zeros(n, dtype=np.int32),
                "status": pa.array(["rejected"] * n, pa.string()),
                "error": pa.array(self._rejected_error, pa.string()),
                "preemptions": np.zeros(n, dtype=np.int32),
            })
            self._rejected_rows, self._rejected_target, self._rejected_error = [], [], []
        if parts:
            self._write(parts)
        self.pending = 0

    def _finished_columns(self, rep: Replica, f: _Finished) -> dict[str, Any]:
        tl = rep.timeline.arrays()
        a = np.array(f.span_a, dtype=np.int64)
        b = np.array(f.span_b, dtype=np.int64)
        nspans = np.array(f.nspans, dtype=np.int64)
        ends = np.cumsum(nspans)
        n = len(f.rows)
        counts = b - a + 1
        out = np.add.reduceat(counts, ends - nspans) if n else np.zeros(0, dtype=np.int64)
        return {
            "rows": np.array(f.rows, dtype=np.int64),
            "target": pa.array([rep.name] * n, pa.string()),
            "first_token_s": step_end_times(tl, a[ends - nspans]),
            "last_token_s": step_end_times(tl, b[ends - 1]),
            "token_times": token_segments(tl, a, b, nspans),
            "output_tokens": out.astype(np.int32),
            "cached_tokens": np.array(f.cached, dtype=np.int32),
            "status": pa.array(["ok"] * n, pa.string()),
            "error": pa.nulls(n, pa.string()),
            "preemptions": np.array(f.preemptions, dtype=np.int32),
        }

    def _write(self, parts: list[dict[str, Any]]) -> None:
        cols = {k: _concat([p[k] for p in parts]) for k in parts[0]}
        rows = cols.pop("rows")
        src = self._trace.take(pa.array(rows))
        sent = self.sent_s[rows]
        self.sink.write({
            "request_id": src.column("request_id").combine_chunks(),
            "tenant": src.column("tenant").cast(pa.string()).combine_chunks(),
            "slo_class": src.column("slo_class").cast(pa.string()).combine_chunks(),
            "scheduled_s": sent,
            "sent_s": sent,
            "input_tokens": src.column("input_tokens").combine_chunks(),
            "requested_output_tokens": src.column("output_tokens").combine_chunks(),
            **cols,
        })


def _concat(pieces: list[Any]) -> Any:
    if all(isinstance(p, np.ndarray) for p in pieces):
        return np.concatenate(pieces)
    return pa.concat_arrays([p if isinstance(p, pa.Array) else pa.array(p) for p in pieces])
