"""BurstGPT (HPMLL/BurstGPT): ChatGPT and GPT-4 usage behind Azure OpenAI, releases 1 to 3.

Columns by name: ``Timestamp`` (seconds from the trace start), ``Model``,
``Request tokens``, ``Response tokens``, ``Total tokens``, ``Log Type``;
release 3 inserts ``Session ID`` and ``Elapsed time``. The model becomes the
tenant, the log type (conversation or API) the kind, the session id a
session. Rows with zero response tokens are requests that failed; they are
kept with ``output_tokens`` 0 (a backend sends them for prefill only) unless
``drop_failed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.errors import UserError
from llmlb_bench.workload.importers.tabular import Columns, assemble, check_file, concat, csv_batches, dictionary, \
    numbers

COLUMNS = Columns(
    required={"time": ["Timestamp"], "input": ["Request tokens"], "output": ["Response tokens"]},
    optional={"model": ["Model"], "log": ["Log Type"], "session": ["Session ID"]},
)


def read_burstgpt(path: str | Path, drop_failed: bool = False) -> pa.Table:
    path = check_file(path)
    parts: dict[str, list[Any]] = {k: [] for k in ("time", "input", "output", "model", "log", "session")}
    types = {"model": pa.string(), "log": pa.string(), "session": pa.string(), "time": pa.float64()}
    for line, cols in csv_batches(path, COLUMNS, types):
        parts["time"].append(numbers(cols["time"], "Timestamp", path, line, dtype=np.float64))
        parts["input"].append(numbers(cols["input"], "Request tokens", path, line))
        parts["output"].append(numbers(cols["output"], "Response tokens", path, line))
        for key in ("model", "log", "session"):
            if key in cols:
                parts[key].append(cols[key])
    time, inp, out = concat(parts["time"]), concat(parts["input"]), concat(parts["output"])
    extra = {k: concat(v) for k, v in parts.items() if k in ("model", "log", "session") and v}
    if drop_failed:
        keep = out > 0
        if not keep.any():
            raise UserError("every row has zero response tokens (all failed); nothing left", path)
        time, inp, out = time[keep], inp[keep], out[keep]
        extra = {k: v.filter(pa.array(keep)) for k, v in extra.items()}
    session = None
    if "session" in extra:
        # Session ids are strings (UUIDs): number them by first appearance.
        codes = pc.dictionary_encode(extra["session"]).indices.to_numpy(zero_copy_only=False)
        session = codes.astype(np.int64)
    return assemble(time, inp, out, source=path,
                    tenant=dictionary(extra["model"]) if "model" in extra else None,
                    kind=dictionary(pc.utf8_lower(pc.replace_substring(extra["log"], " log", "")))
                    if "log" in extra else None,
                    session_id=session)
