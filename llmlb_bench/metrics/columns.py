"""A query's columns read into NumPy arrays batch by batch, into memory a report reuses.

The latency samples and the fairness windows each read a few whole columns of a run into NumPy
(five to seven of five million values each over the ten million rows of ``benchmarks/report_10m.py``).
Handed over as one Arrow table, DuckDB first builds the whole result (77 chunks per column), then
NumPy copies every column out of it: two fresh copies of each column, and on the development machine
the kernel's first touch of fresh memory was a third of the report's CPU (docs/metrics.md, "Speed").
:func:`read` takes DuckDB's record batches one at a time, each copied straight into its place in
arrays allocated once: one copy, and where the arrays come from a :class:`Scratch`, in memory that
an earlier run or stage already touched.
"""

from __future__ import annotations

from typing import Collection, Mapping

import numpy as np
from numpy.typing import DTypeLike

from llmlb_bench.store.views import Catalog

#: rows per record batch: large enough that per-batch overhead is nothing, small enough that DuckDB
#: holds a few MB of its result at a time
BATCH_ROWS = 1 << 17


class Scratch:
    """Memory kept by name for reuse: asking again for a name gives the same memory (its contents are
    the caller's to overwrite), as any dtype (a stage may lend its arrays to the next one under their
    names), grown only when more bytes are asked for, and then with room for a few percent more (the
    next run's ok rows, say, a few more than this one's: pages never written are never the kernel's to
    fault in, so the room costs nothing until it is used)."""

    def __init__(self) -> None:
        self._held: dict[str, np.ndarray] = {}

    def array(self, name: str, n: int, dtype: DTypeLike) -> np.ndarray:
        """``n`` elements of ``dtype`` under ``name``: the memory held under it where it is large enough."""
        dt = np.dtype(dtype)
        size = n * dt.itemsize
        held = self._held.get(name)
        if held is None or len(held) < size:
            held = self._held[name] = np.empty(size + size // 16, np.uint8)
        return held[:size].view(dt)


def read(cat: Catalog, sql: str, rows: int, dtypes: Mapping[str, DTypeLike],
         scratch: Scratch | None = None, keep: Collection[str] = ()) -> dict[str, np.ndarray]:
    """Each column of ``sql``'s result named in ``dtypes``, as a NumPy array of that dtype (the query
    gives values, not nulls: a null of a float column would read as NaN, of an integer one fails).

    ``rows`` is how many rows the caller expects; more are taken as they come (the arrays grow).
    Columns are written into ``scratch``'s arrays of the same names where one is given (valid until
    the next read into it), but those in ``keep``, which the caller keeps: arrays of their own.
    """
    def fresh(name: str, n: int) -> np.ndarray:
        return scratch.array(name, n, dtypes[name]) if scratch is not None and name not in keep \
            else np.empty(n, dtypes[name])

    out = {name: fresh(name, rows) for name in dtypes}
    at = 0
    for batch in cat.query_batches(sql, BATCH_ROWS):
        m = batch.num_rows
        if at + m > len(next(iter(out.values()), ())):
            for name, held in out.items():      # more rows than expected: twice the room, what was read kept
                grown = np.empty(2 * (at + m), dtypes[name])
                grown[:at] = held[:at]
                out[name] = grown
        for name in dtypes:
            out[name][at:at + m] = batch.column(name).to_numpy(zero_copy_only=False)
        at += m
    return {name: held[:at] for name, held in out.items()}
