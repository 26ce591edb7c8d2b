"""Result rows of a replay, buffered as columns and written off the event loop.

Why columns and a writer thread: building one dict per request and letting
the sink convert it costs more than the HTTP exchange itself at thousands of
requests per second, and encoding a Parquet row group (zstd) on the event
loop would stall every stream for milliseconds and show up as fake latency.
Here each finished request appends plain values to lists; every few hundred
rows they become Arrow arrays in one go, and the sink's write (which flushes
row groups with the GIL released) runs on a single background thread, so
rows keep their order.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import pyarrow as pa

from llmlb_bench.schema import TOKEN_SEGMENT
from llmlb_bench.store.sink import ParquetSink

#: scalar columns in the order :meth:`RowBuffer.add` takes them
SCALARS: tuple[tuple[str, pa.DataType], ...] = (
    ("request_id", pa.int64()),
    ("tenant", pa.string()),
    ("slo_class", pa.string()),
    ("target", pa.string()),
    ("scheduled_s", pa.float64()),
    ("sent_s", pa.float64()),
    ("first_token_s", pa.float64()),
    ("last_token_s", pa.float64()),
    ("input_tokens", pa.int32()),
    ("requested_output_tokens", pa.int32()),
    ("output_tokens", pa.int32()),
    ("cached_tokens", pa.int32()),
    ("status", pa.string()),
    ("error", pa.string()),
    ("http_status", pa.int16()),
    ("server_input_tokens", pa.int32()),
    ("output_tokens_estimated", pa.bool_()),
)


class RowBuffer:
    """Column lists for finished requests; ``token_times`` kept as flat segments plus offsets."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._cols: list[list[Any]] = [[] for _ in SCALARS]
        self._seg_start: list[float] = []
        self._seg_count: list[int] = []
        self._offsets: list[int] = [0]
        self._has_segments: list[bool] = []

    def __len__(self) -> int:
        return len(self._cols[0])

    def add(self, values: Sequence[Any], seg_start: Sequence[float] | None,
            seg_count: Sequence[int] | None) -> None:
        """One row: ``values`` in :data:`SCALARS` order; segments ``None`` when no token arrived."""
        for col, v in zip(self._cols, values):
            col.append(v)
        if seg_start:
            self._seg_start.extend(seg_start)
            self._seg_count.extend(seg_count or ())
        self._has_segments.append(bool(seg_start))
        self._offsets.append(len(self._seg_start))

    def take(self) -> dict[str, pa.Array] | None:
        """Everything buffered as Arrow columns (and an empty buffer), or None."""
        if not len(self):
            return None
        out = {name: pa.array(col, type=typ) for (name, typ), col in zip(SCALARS, self._cols)}
        n_seg = len(self._seg_start)
        segments = pa.StructArray.from_arrays(
            [pa.array(self._seg_start, pa.float64()), pa.array([0.0] * n_seg, pa.float64()),
             pa.array(self._seg_count, pa.int32())],
            fields=list(TOKEN_SEGMENT))
        mask = pa.array([not h for h in self._has_segments], pa.bool_())
        out["token_times"] = pa.ListArray.from_arrays(pa.array(self._offsets, pa.int32()), segments,
                                                      mask=mask)
        self._clear()
        return out


class RowWriter:
    """Moves buffered rows into a :class:`ParquetSink` on one background thread."""

    def __init__(self, sink: ParquetSink, batch_rows: int = 512) -> None:
        self.sink = sink
        self.buffer = RowBuffer()
        self.batch_rows = batch_rows
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmlb-rows")
        self._pending: list[asyncio.Future[None]] = []
        self.rows = 0

    def due(self) -> bool:
        return len(self.buffer) >= self.batch_rows

    def submit(self) -> None:
        """Hand what is buffered to the writer thread (in order, without waiting)."""
        cols = self.buffer.take()
        if cols is not None:
            self.rows += len(cols["request_id"])
            loop = asyncio.get_running_loop()
            for fut in [f for f in self._pending if f.done()]:
                self._pending.remove(fut)
                fut.result()  # a failed write surfaces here rather than vanishing
            self._pending.append(loop.run_in_executor(self._pool, self.sink.write, cols))

    async def drain(self) -> None:
        """Submit the rest and wait until the thread has written everything."""
        self.submit()
        pending, self._pending = self._pending, []
        for fut in pending:
            await asyncio.shield(fut)

    def close(self) -> None:
        """Write anything left synchronously (after the loop is gone) and stop the thread."""
        self._pool.shutdown(wait=True)
        cols = self.buffer.take()
        if cols is not None:
            self.rows += len(cols["request_id"])
            self.sink.write(cols)


def write_table(sink: ParquetSink, table: pa.Table) -> None:
    """Append a whole Arrow table of this sink's kind (carried-over or merged rows)."""
    for batch in table.to_batches():
        sink.write({name: batch.column(name) for name in batch.schema.names})
