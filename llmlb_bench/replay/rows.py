"""Result rows of a replay, buffered as columns and written off the event loop.

Why columns and a writer thread: building one dict per request and letting
the sink convert it costs more than the HTTP exchange itself at thousands of
requests per second, and encoding a Parquet row group (zstd) on the event
loop would stall every stream for milliseconds and show up as fake latency.
Each finished request appends plain values to lists (token times to typed
``array`` buffers); handing them over is a swap of buffers, and everything
that costs time (Arrow conversion, about 2 us per row plus 10 ns per token
segment, and the sink's write) runs on a single background thread, so rows
keep their order. Converting on the event loop instead made the dispatcher
up to 10 ms late once a second at 500 requests/s; the replayer also lowers
the interpreter's switch interval so that this thread cannot keep the event
loop waiting for the GIL for long (see ``runner.Replayer.run``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from array import array
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Protocol, Sequence

import numpy as np
import pyarrow as pa

from llmlb_bench.schema import TOKEN_SEGMENT

#: scalar columns in the order :meth:`RowBuffer.add` takes them
SCALARS: tuple[tuple[str, pa.DataType], ...] = (
    ("request_id", pa.int64()),
    ("tenant", pa.string()),
    ("slo_class", pa.string()),
    ("session_id", pa.int64()),
    ("turn", pa.int32()),
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
    ("backend", pa.string()),
    ("adapter", pa.string()),
    ("predicted_cached_tokens", pa.int32()),
    ("reasoning_tokens", pa.int32()),
    ("first_answer_s", pa.float64()),
)


class RequestsSink(Protocol):
    """Where a replayer's rows go: the run's :class:`~llmlb_bench.store.ParquetSink`, or a Ray actor's
    in-memory tap (:class:`~llmlb_bench.replay.ray_workers.RowTap`)."""

    @property
    def pending_rows(self) -> int: ...
    def write(self, columns: Mapping[str, Sequence[object] | pa.Array]) -> None: ...
    def flush_if_due(self) -> None: ...
    def close(self) -> None: ...


class RowBuffer:
    """Column lists for finished requests; ``token_times`` kept as flat segments plus offsets.

    Segment starts are taken as the clock read them; ``origin`` (the run's time 0 on that clock) is
    subtracted when the rows become Arrow arrays, off the event loop and in one NumPy operation
    rather than once per token."""

    def __init__(self) -> None:
        self.origin = 0.0
        self._clear()

    def _clear(self) -> None:
        self._cols: list[list[object]] = [[] for _ in SCALARS]
        self._seg_start = array("d")
        self._seg_count = array("i")
        self._offsets = array("i", [0])

    def __len__(self) -> int:
        return len(self._cols[0])

    def add(self, values: Sequence[object], seg_start: Sequence[float] | None,
            seg_count: Sequence[int] | None) -> None:
        """One row: ``values`` in :data:`SCALARS` order; segments (clock times) ``None`` when no token arrived."""
        for col, v in zip(self._cols, values):
            col.append(v)
        if seg_start:
            self._seg_start.extend(seg_start)
            self._seg_count.extend(seg_count or ())
        self._offsets.append(len(self._seg_start))

    def detach(self) -> "RawRows | None":
        """What is buffered, for :func:`to_arrow` on another thread (and an empty buffer), or None.

        Cheap on purpose: the event loop calls it."""
        if not len(self):
            return None
        raw = RawRows(self._cols, self._seg_start, self._seg_count, self._offsets, self.origin)
        self._clear()
        return raw


class RawRows:
    """A detached :class:`RowBuffer`'s contents."""

    __slots__ = ("cols", "seg_start", "seg_count", "offsets", "origin")

    def __init__(self, cols: list[list[object]], seg_start: array[float], seg_count: array[int], offsets: array[int],
                 origin: float) -> None:
        self.cols, self.seg_start, self.seg_count, self.offsets = cols, seg_start, seg_count, offsets
        self.origin = origin

    def __len__(self) -> int:
        return len(self.cols[0])

    def to_arrow(self) -> dict[str, pa.Array]:
        """The rows as Arrow columns; a row without segments gets a null ``token_times``."""
        out = {name: pa.array(col, type=typ) for (name, typ), col in zip(SCALARS, self.cols)}
        starts = (np.frombuffer(self.seg_start, dtype=np.float64) - self.origin if self.seg_start
                  else np.zeros(0))
        counts = np.frombuffer(self.seg_count, dtype=np.int32) if self.seg_count else np.zeros(0, np.int32)
        offsets = np.frombuffer(self.offsets, dtype=np.int32)
        segments = pa.StructArray.from_arrays(
            [pa.array(starts), pa.array(np.zeros(starts.size)), pa.array(counts)], fields=list(TOKEN_SEGMENT))
        out["token_times"] = pa.ListArray.from_arrays(pa.array(offsets), segments,
                                                      mask=pa.array(offsets[1:] == offsets[:-1]))
        return out


#: how much lower than the replayer's the writer thread's priority is: nice +10, about a tenth of a
#: normal thread's share of a contended core (CFS weights 110 against 1024)
WRITER_NICE = 10


def _background() -> None:
    """Lower this thread's priority (Linux: ``nice()`` sets the calling thread's own).

    With the replayer pinned to one core, the writer's work would otherwise
    take the core from the event loop for a scheduler slice (milliseconds)
    at a time; at a lower priority the event loop preempts it when it wakes
    up. Not ``SCHED_IDLE``, which it was: an idle-class thread runs only
    when nothing else wants the core, so on a saturated machine (a busy loop
    on the same core) finished rows waited more than 8 s to reach the disk,
    against the two seconds the crash-safety promise gives (docs/security.md).
    At nice +10 it still gets a tenth of a share, far more than its few
    milliseconds per second of rows. Elsewhere ``nice()`` would lower the
    whole process, so the thread keeps normal priority."""
    if sys.platform.startswith("linux"):
        try:
            os.nice(WRITER_NICE)
        except OSError:
            pass


class RowWriter:
    """Moves buffered rows into a :class:`ParquetSink` on one background thread."""

    def __init__(self, sink: RequestsSink, batch_rows: int = 512) -> None:
        self.sink = sink
        self.buffer = RowBuffer()
        self.batch_rows = batch_rows
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmlb-rows", initializer=_background)
        self._pending: list[asyncio.Future[None]] = []
        self.rows = 0

    def due(self) -> bool:
        return len(self.buffer) >= self.batch_rows

    def submit(self) -> None:
        """Hand what is buffered to the writer thread (in order, without waiting); with nothing
        new, still let the sink flush rows it holds once its interval has passed (the replayer
        calls this every second, so finished rows reach the disk within about two)."""
        raw = self.buffer.detach()
        if raw is not None or self.sink.pending_rows:
            self.rows += len(raw) if raw is not None else 0
            loop = asyncio.get_running_loop()
            for fut in [f for f in self._pending if f.done()]:
                self._pending.remove(fut)
                fut.result()  # a failed write surfaces here rather than vanishing
            self._pending.append(loop.run_in_executor(self._pool, self._write, raw))

    def _write(self, raw: RawRows | None) -> None:
        if raw is not None:
            self.sink.write(raw.to_arrow())
        self.sink.flush_if_due()

    async def drain(self) -> None:
        """Submit the rest and wait until the thread has written everything."""
        self.submit()
        pending, self._pending = self._pending, []
        for fut in pending:
            await asyncio.shield(fut)

    def close(self) -> None:
        """Write anything left synchronously (after the loop is gone) and stop the thread."""
        self._pool.shutdown(wait=True)
        raw = self.buffer.detach()
        if raw is not None:
            self.rows += len(raw)
            self._write(raw)


def write_table(sink: RequestsSink, table: pa.Table) -> None:
    """Append a whole Arrow table of this sink's kind (carried-over or merged rows)."""
    for batch in table.to_batches():
        sink.write({name: batch.column(name) for name in batch.schema.names})
