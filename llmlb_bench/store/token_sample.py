"""The token times of the report's block sample, kept apart as a run is written, so the report reads them alone.

Why: token-level figures of a large run read a block sample of its requests
(:mod:`llmlb_bench.metrics.sample`: evenly spaced blocks of consecutive request
ids). A simulated run writes its rows as requests finish, so every row group of
``requests.parquet`` holds ids from its whole span and the blocks touch every
one of them; Parquet readers (DuckDB's, Arrow's) decode a list column a row
group at a time, so reading the sample's ``token_times`` cost decoding every
list of the run (0.2-0.3 CPU-s of a 100k-request run's report). A backend that
knows its trace's id range names the blocks of the default sample up front
(:class:`llmlb_bench.store.run.RunStore`'s ``token_sample``); every requests
batch written then also sends the rows inside them, request id and token times
only, to ``token_sample.arrow`` (about a tenth of a 100k-request run's lists,
a five-hundredth of a 5M one's), written when the run closes: copying and writing
them costs the run about 0.08 CPU-s per 10,000 sampled requests (the 100k chat
run: 1.5-2 CPU-s). run.json names the ranges and the rows once both files are closed; the report takes them from here only when its blocks are
those ranges and every sampled row is found here, else from the requests (runs
written before this file, or killed, or reported with another sample size).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence, TypedDict

import numpy as np
import pyarrow as pa

from llmlb_bench.schema import TOKEN_SAMPLE
from llmlb_bench.store.sink import rows_table

TOKEN_SAMPLE_FILE = "token_sample.arrow"
#: run.json's key for it (:class:`TokenSampleRef`)
RUN_JSON_KEY = "token_sample_arrow"
#: the kept sample of runs written before it was an Arrow file: a Parquet part folder, named by run.json's
#: ``token_sample``, read as before; the Arrow file has a key of its own so that an older reader, which
#: would hand it to DuckDB's Parquet reader, finds none and reads the requests
PARQUET_FILE = "token_sample.parquet"
PARQUET_KEY = "token_sample"


class TokenSampleRef(TypedDict):
    """run.json's ``token_sample``: the request id ranges kept (inclusive) and the rows written."""

    file: str
    ranges: list[list[int]]
    rows: int


class TokenSampleSink:
    """Keeps the request id and token times of the rows whose id lies in ``ranges`` (inclusive, disjoint).

    WHY an Arrow IPC file (LZ4-compressed) and not Parquet like the run's tables: the report reads
    the whole file back, and Parquet's decoding of 1.4M nested segments (the 100k chat run's sample)
    cost 0.024 CPU-s, Arrow's 0.003 (the file 2.1 MB against 2.5); the writing costs the run less
    too. The rows are buffered until the close (a sample's worth: 28 MB of lists on the 100k run) and
    written at once: temporary name, fsync, rename; a run killed before it leaves no file."""

    def __init__(self, run_dir: Path, run_id: str, ranges: Sequence[tuple[int, int]]) -> None:
        self.ranges = sorted((int(a), int(b)) for a, b in ranges)
        self._starts = np.array([a for a, _ in self.ranges], dtype=np.int64)
        self._ends = np.array([b for _, b in self.ranges], dtype=np.int64)
        self.path = run_dir / TOKEN_SAMPLE_FILE
        self.run_id = run_id
        self._tables: list[pa.Table] = []
        self.rows_written = 0

    def take(self, table: pa.Table) -> None:
        """Keep the rows of a requests batch (its schema's table) that lie in the ranges."""
        ids = table.column("request_id").to_numpy()
        block = np.searchsorted(self._starts, ids, side="right") - 1
        inside = (block >= 0) & (ids <= self._ends[np.maximum(block, 0)])
        if inside.any():
            rows = table.select(["request_id", "token_times"]).filter(pa.array(inside))
            kept = rows_table(TOKEN_SAMPLE, {"request_id": rows.column("request_id").combine_chunks(),
                                             "token_times": rows.column("token_times").combine_chunks()},
                              {"run_id": self.run_id})
            if kept is not None:
                self._tables.append(kept)

    def close(self) -> TokenSampleRef:
        schema = TOKEN_SAMPLE.schema.with_metadata(TOKEN_SAMPLE.metadata())
        table = pa.concat_tables(self._tables).replace_schema_metadata(schema.metadata) if self._tables \
            else TOKEN_SAMPLE.empty().replace_schema_metadata(schema.metadata)
        self._tables = []
        codec = "lz4" if pa.Codec.is_available("lz4") else None
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            with open(tmp, "wb") as f:
                with pa.ipc.new_file(f, schema, options=pa.ipc.IpcWriteOptions(compression=codec)) as writer:
                    writer.write_table(table)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.path)
        finally:
            tmp.unlink(missing_ok=True)
        self.rows_written = table.num_rows
        return {"file": TOKEN_SAMPLE_FILE, "ranges": [[a, b] for a, b in self.ranges], "rows": self.rows_written}


def kept_ref(meta: Mapping[str, object]) -> Mapping[str, object] | None:
    """run.json's reference to the run's kept sample (the Arrow file, or an older run's Parquet folder), if any."""
    for key in (RUN_JSON_KEY, PARQUET_KEY):
        ref = meta.get(key)
        if isinstance(ref, dict):
            return ref
    return None


def read_kept(path: str | Path, columns: Sequence[str]) -> pa.Table:
    """The ``columns`` of a kept sample's file: the Arrow file, or one part file of the Parquet folder
    that runs written before it kept. Raises OSError or pyarrow.ArrowInvalid where it cannot be read."""
    if str(path).endswith(".arrow"):
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all().select(list(columns))
    import pyarrow.parquet as pq

    return pq.ParquetFile(str(path)).read(columns=list(columns), use_threads=False)
