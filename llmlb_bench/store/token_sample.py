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
only, to ``token_sample.parquet`` (about a tenth of a 100k-request run's lists,
a five-hundredth of a 5M one's), written when the run closes: copying and writing
them costs the run about 0.08 CPU-s per 10,000 sampled requests (the 100k chat
run: 1.5-2 CPU-s). run.json names the ranges and the rows once both files are closed; the report takes them from here only when its blocks are
those ranges and every sampled row is found here, else from the requests (runs
written before this file, or killed, or reported with another sample size).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence, TypedDict

import numpy as np
import pyarrow as pa

from llmlb_bench.schema import TOKEN_SAMPLE
from llmlb_bench.store.sink import ParquetSink

TOKEN_SAMPLE_FILE = "token_sample.parquet"


class TokenSampleRef(TypedDict):
    """run.json's ``token_sample``: the request id ranges kept (inclusive) and the rows written."""

    file: str
    ranges: list[list[int]]
    rows: int


class TokenSampleSink:
    """Keeps the request id and token times of the rows whose id lies in ``ranges`` (inclusive, disjoint)."""

    def __init__(self, run_dir: Path, run_id: str, ranges: Sequence[tuple[int, int]], *, rows_per_group: int) -> None:
        self.ranges = sorted((int(a), int(b)) for a, b in ranges)
        self._starts = np.array([a for a, _ in self.ranges], dtype=np.int64)
        self._ends = np.array([b for _, b in self.ranges], dtype=np.int64)
        # written when the run closes (or a row group fills): the report reads the file only after
        # run.json has counted its rows, at the close, so a part flushed earlier would serve no reader
        self.sink = ParquetSink(run_dir / TOKEN_SAMPLE_FILE, TOKEN_SAMPLE, constants={"run_id": run_id},
                                rows_per_group=rows_per_group, flush_s=math.inf)

    def take(self, table: pa.Table) -> None:
        """Keep the rows of a requests batch (its schema's table) that lie in the ranges."""
        ids = table.column("request_id").to_numpy()
        block = np.searchsorted(self._starts, ids, side="right") - 1
        inside = (block >= 0) & (ids <= self._ends[np.maximum(block, 0)])
        if inside.any():
            rows = table.select(["request_id", "token_times"]).filter(pa.array(inside))
            self.sink.write({"request_id": rows.column("request_id").combine_chunks(),
                             "token_times": rows.column("token_times").combine_chunks()})

    def close(self) -> TokenSampleRef:
        self.sink.close()
        return {"file": TOKEN_SAMPLE_FILE, "ranges": [[a, b] for a, b in self.ranges], "rows": self.sink.rows_written}
