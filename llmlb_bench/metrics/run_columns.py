"""A run's scalar columns read once, for both the latency samples and the fairness windows.

Over the ten million rows of ``benchmarks/report_10m.py`` the latency stage read each run's ok rows'
figures (TTFT, TPOT, E2E, normalized latency, wait: the ``request_metrics`` view's expressions, evaluated
by DuckDB) and the fairness stage read the same run's times and tokens again: two decodings of the
same Parquet columns per run (0.37 + 0.21 CPU-s per run of 5M rows), where one read of the raw
columns takes 0.26-0.27 (docs/metrics.md, "Speed"). :func:`read_run` reads them once, one run at a
time into scratch memory (:mod:`llmlb_bench.metrics.columns`); :func:`values` computes a figure's
values from them, and :func:`llmlb_bench.metrics.fairness.windows_of` the windows.

Every value is the view's to the bit: each is one IEEE operation on the same doubles, in the view's
order (``first_token_s - origin_s``; ``(last_token_s - first_token_s) / (output_tokens - 1)``, the
integer cast to double as DuckDB does), and a null reads as NaN, which every figure drops as it
dropped a null. Only the figures of :data:`VALUES` and :data:`WEIGHTS` are computed so; a run whose
figures name others (the answer's figures of a run with reasoning) is read by the stages' own SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
from numpy.typing import DTypeLike

from llmlb_bench.metrics.columns import Scratch, read
from llmlb_bench.metrics.definitions import Figure
from llmlb_bench.metrics.sql import quote
from llmlb_bench.store.views import Catalog

#: the per-request figures (``request_metrics`` columns) :func:`values` computes, and their weights
VALUES = ("ttft_s", "e2e_s", "tpot_s", "norm_latency_s", "wait_s")
WEIGHTS = ("1", "output_tokens", "output_tokens - 1")
#: rows :func:`_indices` takes at a time
BLOCK_ROWS = 1 << 18
#: the scratch array :func:`values` computes every row's values in (free again once it returns)
VALUE = "run_value"


def serves(figs: Mapping[str, Figure]) -> bool:
    """Whether :func:`values` computes every per-request figure of ``figs`` (ITL's, read from the token
    rows, has no value here)."""
    return all(f.value in VALUES and f.weight in WEIGHTS for f in figs.values() if f.value is not None)


@dataclass
class RunColumns:
    """One run's rows: times as float64 (NaN for null), token counts as float64 (whole numbers, 0 for null:
    what the fairness windows read, and exact in the figures' arithmetic), each row's cell among its groups
    (:func:`llmlb_bench.metrics.latency._cells`; None where it has none), and which rows are ok (None where
    every one is)."""

    arrival: bool                # latency counts from arrival (scheduled_s), else from sending
    scheduled: np.ndarray
    sent: np.ndarray
    first: np.ndarray
    last: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    cell: np.ndarray | None
    ok: np.ndarray | None       # the ok rows' indices
    n_ok: int

    @property
    def origin(self) -> np.ndarray:
        """Every row's latency origin (``request_metrics.origin_s``)."""
        return self.scheduled if self.arrival else self.sent

    @property
    def spare_time(self) -> str:
        """The name of the scratch array of the time column that is not the origin (free once the latency
        figures are computed)."""
        return "run_sent" if self.arrival else "run_scheduled"

    def ok_rows(self, column: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The ok rows of a column of the run's rows: the column itself where every row is ok, else a
        copy (into ``out`` where given)."""
        if self.ok is None:
            return column
        # a gather by the indices, unbuffered ("clip": they are valid), where np.compress with an output
        # found the indices again and went through a buffer: 140 MB of fresh memory a column
        return np.take(column, self.ok, out=out[:self.n_ok] if out is not None else None, mode="clip")


def read_run(cat: Catalog, run_id: str, rows: int, arrival: bool, cell_sql: str | None, cell_dtype: DTypeLike,
             scratch: Scratch) -> RunColumns:
    """Every row of ``run_id`` (``rows`` expected), in ``scratch``'s memory (valid until the next run's
    read): one scan of its Parquet columns. ``cell_sql`` (``... AS cell``) numbers each row's cell."""
    dtypes: dict[str, DTypeLike] = {"run_scheduled": np.float64, "run_sent": np.float64, "run_first": np.float64,
                                    "run_last": np.float64, "run_in": np.float64, "run_out": np.float64,
                                    "run_ok": np.bool_}
    cell = [cell_sql.removesuffix(" AS cell") + " AS run_cell"] if cell_sql else []
    if cell_sql:
        dtypes["run_cell"] = cell_dtype
    # floats as they are (a null is NaN in NumPy); the token counts coalesced to 0, which every use of
    # them reads as the view read a null (no figure, no service, no output), as doubles (exact)
    c = read(cat, f"""
        SELECT scheduled_s AS run_scheduled, sent_s AS run_sent, first_token_s AS run_first, last_token_s AS run_last,
               coalesce(input_tokens, 0)::DOUBLE AS run_in, coalesce(output_tokens, 0)::DOUBLE AS run_out,
               coalesce(status = 'ok', false) AS run_ok{''.join(', ' + x for x in cell)}
        FROM requests WHERE run_id = {quote(run_id)}""", rows, dtypes, scratch)
    ok = c["run_ok"]
    n_ok = int(np.count_nonzero(ok))
    return RunColumns(arrival=arrival, scheduled=c["run_scheduled"], sent=c["run_sent"], first=c["run_first"],
                      last=c["run_last"], input_tokens=c["run_in"], output_tokens=c["run_out"],
                      cell=c.get("run_cell"), ok=None if n_ok == len(ok) else _indices(ok, n_ok, scratch), n_ok=n_ok)


def _indices(ok: np.ndarray, n_ok: int, scratch: Scratch) -> np.ndarray:
    """The indices of ``ok``'s true rows in ``scratch``'s memory, found a block at a time (np.flatnonzero
    of every row at once is a fresh array of them each run)."""
    out = scratch.array("run_ok_index", n_ok, np.intp)
    at = 0
    for a in range(0, len(ok), BLOCK_ROWS):
        rows = np.flatnonzero(ok[a:a + BLOCK_ROWS])
        np.add(rows, a, out=out[at:at + len(rows)])
        at += len(rows)
    return out


def values(cols: RunColumns, value: str, scratch: Scratch, name: str) -> np.ndarray:
    """The ok rows' ``value`` (one of :data:`VALUES`) in ``scratch``'s memory under ``name``, as the
    ``request_metrics`` view computes it, NaN where the view gives null (computed over every row, then
    the ok rows copied out where some are not)."""
    n = len(cols.first)
    # computed in one of two arrays, the other free meanwhile (the ok rows are copied into it after)
    out, spare = (scratch.array(k, n, np.float64) for k in ((VALUE, name) if cols.ok is not None else (name, VALUE)))
    if value == "ttft_s":
        np.subtract(cols.first, cols.origin, out=out)
    elif value == "e2e_s":
        np.subtract(cols.last, cols.origin, out=out)
    elif value == "wait_s":
        np.subtract(cols.sent, cols.scheduled, out=out)
    else:
        # CASE WHEN output_tokens > 1 THEN (last - first) / (output_tokens - 1) END, and
        # CASE WHEN output_tokens > 0 THEN (last - origin) / output_tokens END: the integer count cast to
        # double, as DuckDB divides a DOUBLE by an INTEGER (the doubles here are those casts)
        if value == "tpot_s":
            since, least, less = cols.first, 1, 1.0
        elif value == "norm_latency_s":
            since, least, less = cols.origin, 0, 0.0
        else:
            raise ValueError(f"not a value computed here: {value}")
        # (every row computed, then the others made null: whole-array arithmetic, where a masked one is
        # several times slower)
        np.subtract(cols.last, since, out=out)
        tokens = np.subtract(cols.output_tokens, less, out=spare) if less else cols.output_tokens
        with np.errstate(divide="ignore", invalid="ignore"):
            np.divide(out, tokens, out=out)
        np.copyto(out, np.nan, where=np.less_equal(cols.output_tokens, least, out=scratch.array("run_none", n, np.bool_)))
    # (as long as every row, whatever the ok rows: the fairness windows borrow it, metrics/summary.py)
    return cols.ok_rows(out, spare) if cols.ok is not None else out


def weights(cols: RunColumns, weight: str, scratch: Scratch, name: str) -> np.ndarray | None:
    """The ok rows' ``weight`` (one of :data:`WEIGHTS`; None for "1") as int64, in ``scratch``'s memory
    under ``name``. Where the view's weight is null (a null output count) the value is null too, so the
    row is dropped whatever its weight here."""
    if weight == "1":
        return None
    out = scratch.array(name, cols.n_ok, np.int64)
    tokens = cols.ok_rows(cols.output_tokens, scratch.array("run_ok_tokens", len(cols.output_tokens), np.float64))
    if weight == "output_tokens":
        np.copyto(out, tokens, casting="unsafe")
    elif weight == "output_tokens - 1":
        np.subtract(tokens, 1, out=out, casting="unsafe")
    else:
        raise ValueError(f"not a weight computed here: {weight}")
    return out


def duckdb_double(cat: Catalog, x: float) -> float:
    """The double DuckDB subtracts where SQL subtracts the literal ``{x!r}`` from a DOUBLE column (a
    decimal literal, cast to DOUBLE: not always Python's float of the same digits)."""
    return -float(cat.query(f"SELECT 0.0::DOUBLE - {x!r} AS x").column("x")[0].as_py())
