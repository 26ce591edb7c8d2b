"""Streaming Parquet sink.

Rows arrive while a run is in flight. They are buffered as columns and
flushed when the buffer holds ``rows_per_group`` rows or ``flush_s`` seconds
have passed since the last flush. Each flush writes one complete Parquet part
file into the sink's folder (:mod:`llmlb_bench.store.parts`: temporary name,
fsync, rename), so a run killed at any instant — SIGKILL and power loss
included, where no ``finally`` runs — keeps every row flushed before it: at
most the last ``flush_s`` seconds of finished rows are lost.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Mapping, Sequence, TypedDict

import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.redact import redact_array
from llmlb_bench.schema import TableSpec
from llmlb_bench.store.derived import with_derived
from llmlb_bench.store.parts import replace_table, table_files, write_part

#: at close, a folder of more parts than this whose mean part is under an eighth of a row group
#: (a long, slow replay flushing every 2 s) is compacted into one part
COMPACT_PARTS = 64


def rows_table(spec: TableSpec, columns: Mapping[str, Sequence[object] | pa.Array],
               constants: Mapping[str, object]) -> pa.Table | None:
    """Columns (lists, NumPy or Arrow arrays) as a table of ``spec``'s schema, None when there is no row.

    Columns of the schema that are absent are null, except ``constants``, which fill every row."""
    n = len(next(iter(columns.values()))) if columns else 0
    if n == 0:
        return None
    arrays = []
    for f in spec.schema:
        if f.name in columns:
            arrays.append(pa.array(columns[f.name], type=f.type))
        elif f.name in constants:
            arrays.append(pa.repeat(pa.scalar(constants[f.name], type=f.type), n))
        else:
            arrays.append(pa.nulls(n, type=f.type))
    return pa.Table.from_arrays(arrays, schema=spec.schema)


class Layout(TypedDict):
    """The options of :func:`layout`, as :class:`pyarrow.parquet.ParquetWriter` takes them."""

    compression: str
    use_dictionary: list[str]
    write_statistics: list[str]
    column_encoding: dict[str, str]


def layout(schema: pa.Schema) -> Layout:
    """How a table of ``schema`` is laid out in Parquet: the writer's options (every writer of run
    tables uses them, so a run reads the same way whichever backend wrote it).

    Every column is zstd-compressed. Strings (targets, statuses, tenants) are dictionary-encoded:
    dictionary encoding tried on every float column and on token_times' nested fields cost a third
    of the write time of a simulated run's requests and made the file 15% larger. Flat floats are
    BYTE_STREAM_SPLIT (each byte of the values stored apart: the sign, exponent and high mantissa
    bytes of times and energies repeat from row to row and compress, where plain doubles hardly
    did) and flat integers DELTA_BINARY_PACKED (differences, bit-packed): over the ten million rows
    of benchmarks/report_10m.py the files are 13% smaller, their writing costs no more, and the
    report's scans decode a double column in 0.065 CPU-s per 10M values rather than 0.11 (an integer
    0.035 rather than 0.06), zstd's decompression of incompressible bytes being most of that cost.
    token_times' fields keep plain encoding (the two encodings on its fields made the files of a
    simulated 100k-request run 70% larger). Min/max statistics serve row-group skipping on flat columns; on nested ones
    (token_times) nobody filters, and they cost a fifth of the rest.
    """
    strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)]
    flat = [f.name for f in schema if not pa.types.is_nested(f.type)]
    encodings = {f.name: "BYTE_STREAM_SPLIT" if pa.types.is_floating(f.type) else "DELTA_BINARY_PACKED"
                 for f in schema if pa.types.is_floating(f.type) or pa.types.is_integer(f.type)}
    return {"compression": "zstd", "use_dictionary": strings, "write_statistics": flat, "column_encoding": encodings}


class ParquetSink:
    """Append rows of one :class:`TableSpec` to a part folder (``path``), one part per flush."""

    def __init__(self, path: str | Path, spec: TableSpec, *, rows_per_group: int = 65536,
                 flush_s: float = 2.0, constants: Mapping[str, object] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 tee: Callable[[pa.Table], None] | None = None) -> None:
        self.path = Path(path)
        #: also handed every batch written (its table, derived columns filled): store/token_sample.py
        self.tee = tee
        self.spec = spec
        self.rows_per_group = rows_per_group
        self.flush_s = flush_s
        self.constants = dict(constants or {})
        self._clock = clock
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._last_flush = clock()
        self._schema = spec.schema.with_metadata(spec.metadata())
        self._options = layout(spec.schema)
        self.path.mkdir(parents=True, exist_ok=True)
        self._parts = len(table_files(self.path))
        self.rows_written = 0
        self.closed = False

    def write(self, columns: Mapping[str, Sequence[object] | pa.Array]) -> None:
        """Buffer a batch of rows given as columns (lists, NumPy arrays or Arrow arrays).

        Columns of the schema that are absent are null, except ``constants``
        given at construction (e.g. ``run_id``), which fill every row.
        """
        table = rows_table(self.spec, columns, self.constants)
        if table is not None:
            table = with_derived(table)
            if self.tee is not None:
                self.tee(table)
            self._append(table)

    def _append(self, table: pa.Table) -> None:
        i = table.schema.get_field_index("error")
        if i >= 0:  # outside text (a server's error body) is stored only redacted
            table = table.set_column(i, table.field(i), redact_array(table.column(i)))
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= self.rows_per_group:
            self.flush()
        else:
            self.flush_if_due()

    @property
    def pending_rows(self) -> int:
        """Rows buffered, not yet on disk."""
        return self._pending_rows

    def flush_if_due(self) -> None:
        """Flush when rows are buffered and ``flush_s`` has passed since the last flush (producers
        that may go quiet call it on a timer, so buffered rows do not wait for the next write)."""
        if self._pending_rows and self._clock() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as one complete part file now."""
        if self._pending_rows:
            self._write_part(self._pending)
            self.rows_written += self._pending_rows
        self._pending.clear()
        self._pending_rows = 0
        self._last_flush = self._clock()

    def _write_part(self, tables: list[pa.Table]) -> None:
        # the buffered batches as one table (no copy: its columns are chunked), so that a part has row
        # groups of rows_per_group rows rather than one per batch: the simulator writes a batch per
        # replica, and each row group opens a compressor per column (a fifth of the write time)
        write_part(self.path, self._parts, [pa.concat_tables(tables)] if len(tables) > 1 else tables,
                   self._schema, row_group_size=self.rows_per_group, **self._options)
        self._parts += 1

    def close(self) -> None:
        """Flush; a folder with no part gets an empty one (the schema); many small parts are
        compacted into one. Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        self.flush()
        if self._parts == 0:
            self._write_part([])
        elif self._parts > COMPACT_PARTS and self.rows_written < self._parts * self.rows_per_group // 8:
            files = table_files(self.path)
            replace_table(self.path, (pq.read_table(f) for f in files), self._schema,
                          row_group_size=self.rows_per_group, **self._options)
