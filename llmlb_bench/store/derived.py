"""Per-request columns the store derives from ``token_times`` as rows are written.

Why here: ``token_times`` is by far the largest column of a run, and a query that names it decodes
every list (on a simulated run, ninety segments a request). A figure that needs one number per
request from the lists (tokens per delivery: docs/metrics.md, "Speculative decoding") would make
the report decode them all again at every report; counted once as the batch is written, in NumPy
over the batch's flattened segments, it costs the run a few milliseconds per hundred thousand
segments and the report a scalar column. Every backend writes through the store, so every new
run has the column; files written before it read it as null, and the figure falls back to the
lists there (:mod:`llmlb_bench.metrics.speculative`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DELIVERIES = "deliveries"


def deliveries(token_times: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Per row, the deliveries of its ``token_times``: one per segment of gap 0 (tokens that arrive
    together: a stream chunk, a bundled verify step), ``count`` per spaced segment; 0 for a null or
    empty list. A segment's null fields count as SQL's ``CASE WHEN gap_s = 0 THEN 1 ELSE count END``
    under ``list_sum`` counts them: a null gap is not 0, a null count adds nothing."""
    tt = token_times.combine_chunks() if isinstance(token_times, pa.ChunkedArray) else token_times
    lengths = pc.list_value_length(tt).fill_null(0).to_numpy().astype(np.int64)
    seg = pc.list_flatten(tt)                       # null lists contribute no segment
    gap, count = seg.field("gap_s"), seg.field("count")
    gap = (gap.fill_null(np.nan) if gap.null_count else gap).to_numpy()          # no copy without nulls
    per = (count.fill_null(0) if count.null_count else count).to_numpy().astype(np.int64)
    per[gap == 0] = 1
    total = np.r_[0, np.cumsum(per)]
    end = np.cumsum(lengths)
    out: np.ndarray = total[end] - total[end - lengths]
    return pa.array(out, pa.int64())


def with_derived(table: pa.Table) -> pa.Table:
    """``table`` with its derived columns filled where the schema has them and every value is null
    (a writer that set one itself keeps its values)."""
    i = table.schema.get_field_index(DELIVERIES)
    if i < 0 or "token_times" not in table.column_names or table.column(i).null_count < table.num_rows:
        return table
    return table.set_column(i, table.field(i), deliveries(table.column("token_times")))
