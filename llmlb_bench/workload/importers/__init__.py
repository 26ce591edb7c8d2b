"""Importers of public production traces into the TRACE schema (``llmlb trace import``).

Each format maps to one reader; :func:`import_trace` returns the table plus
what goes into the file's metadata (block size of the prefix hashes, the
generating spec for parameter-only formats such as ServeGen).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import Value
from llmlb_bench.trace_formats import check_format
from llmlb_bench.workload.generate import generate
from llmlb_bench.workload.importers import azure, burstgpt, jsonl, servegen, sharegpt
from llmlb_bench.workload.spec import WorkloadSpec


@dataclass
class Imported:
    table: pa.Table
    block_size: int | None = None
    spec: dict[str, Value] | None = None
    notes: list[str] = field(default_factory=list)


def import_trace(fmt: str, path: str | Path, *, kind: str | None = None, tenant: str | None = None,
                 drop_failed: bool = False, rate: float = 10.0, process: str = "poisson", cv: float = 1.0,
                 seed: int = 0, multi_turn: bool = False, think_s: float = 30.0,
                 chars_per_token: float = 4.0, limit: int | None = None,
                 duration_s: float | None = None) -> Imported:
    """Read ``path`` in format ``fmt``; options apply to the formats that use them. ``limit`` and
    ``duration_s`` cap the import (:func:`cap`)."""
    path = Path(path)
    check_format(fmt)
    if limit is not None and limit < 1:
        raise UserError(f"must be at least 1, got {limit}", "--limit")
    if duration_s is not None and not duration_s > 0:
        raise UserError(f"must be > 0 seconds, got {duration_s:g}", "--duration")
    if fmt.startswith("azure"):
        out = Imported(azure.read_azure(path, kind or "chat"))
    elif fmt == "burstgpt":
        out = Imported(burstgpt.read_burstgpt(path, drop_failed=drop_failed))
    elif fmt == "mooncake":
        out = Imported(jsonl.read_mooncake(path), block_size=jsonl.MOONCAKE_BLOCK)
    elif fmt == "bailian":
        out = Imported(jsonl.read_bailian(path), block_size=jsonl.BAILIAN_BLOCK)
    elif fmt == "sharegpt":
        if rate <= 0:
            raise UserError("--rate must be > 0")
        out = Imported(sharegpt.read_sharegpt(path, rate=rate, process=process, cv=cv, seed=seed,
                                              multi_turn=multi_turn, think_s=think_s,
                                              chars_per_token=chars_per_token), block_size=sharegpt.BLOCK)
    else:
        # generate no more than is kept (ServeGen's horizons run to days)
        spec = servegen.servegen_spec(path, seed=seed, duration_s=duration_s)
        workload = WorkloadSpec.from_dict(spec, str(path))
        out = Imported(generate(workload), spec=workload.to_dict(), block_size=workload.block_size)
    if tenant is not None or kind is not None:
        out.table = _relabel(out.table, tenant=tenant, kind=kind)
    if limit is not None or duration_s is not None:
        out.table = cap(out.table, limit, duration_s)
    return out


def cap(table: pa.Table, limit: int | None, duration_s: float | None) -> pa.Table:
    """The first ``limit`` requests in arrival order, and of those the ones arriving within
    ``duration_s`` of the first arrival (None: no such cap), in the table's order. A later turn
    arrives no earlier than the turn it follows, so a kept turn's parent is always kept too."""
    arrival = table.column("arrival_s").to_numpy()
    keep = np.ones(table.num_rows, dtype=bool)
    if limit is not None and limit < table.num_rows:
        order = np.lexsort((table.column("request_id").to_numpy(), arrival))
        keep[:] = False
        keep[order[:limit]] = True
    if duration_s is not None and table.num_rows:
        keep &= arrival < arrival.min() + duration_s
    return table if keep.all() else table.filter(pa.array(keep))


def _relabel(table: pa.Table, **values: str | None) -> pa.Table:
    for name, value in values.items():
        if value is not None:
            col = pa.DictionaryArray.from_arrays(pa.array(np.zeros(table.num_rows, np.int32)), pa.array([value]))
            table = table.set_column(table.schema.get_field_index(name), table.schema.field(name), col)
    return table
