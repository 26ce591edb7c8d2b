"""Shared machinery of the importers: columns by header name, streaming reads, timestamps, assembly.

Real traces are large (BurstGPT has 10M rows) and their layouts drift
between releases, so every importer

* finds columns by *header name* (case- and space-insensitive), never by
  position, and names the missing one and the columns it did find;
* reads in record batches (``pyarrow.csv.open_csv`` / ``pyarrow.json.open_json``)
  and turns each batch into NumPy arrays, so memory is a few columns of
  numbers and never one Python object per row;
* reports a bad value with its line number.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson

from llmlb_bench.errors import UserError
from llmlb_bench.schema import TRACE

BLOCK = 16 << 20  # bytes per streamed CSV/JSON block


def _norm(name: str) -> str:
    return "".join(name.lower().split()).replace("_", "")


@dataclass(frozen=True)
class Columns:
    """Header names wanted by an importer: each logical column has a few accepted spellings."""

    required: Mapping[str, Sequence[str]]
    optional: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def resolve(self, header: Sequence[str], path: Path) -> dict[str, str]:
        """Map logical names to the file's actual header names (optional ones only if present)."""
        by_norm = {_norm(h): h for h in header}
        found: dict[str, str] = {}
        for logical, names in {**self.required, **self.optional}.items():
            hit = next((by_norm[_norm(n)] for n in names if _norm(n) in by_norm), None)
            if hit is not None:
                found[logical] = hit
            elif logical in self.required:
                raise UserError(f"missing column {names[0]!r} (found: {', '.join(header) or 'no header'})", path)
        return found


def check_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise UserError("no such file", path)
    if path.is_dir():
        raise UserError("is a directory, expected a file", path)
    return path


def csv_header(path: Path) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        try:
            first = f.readline()
        except UnicodeDecodeError:
            raise UserError("not a text (UTF-8) CSV file", path) from None
    if not first.strip():
        raise UserError("empty file (expected a CSV header line)", path)
    return next(csv.reader(io.StringIO(first)))


def csv_batches(path: Path, cols: Columns, types: Mapping[str, pa.DataType]) -> Iterator[tuple[int, dict[str, pa.Array]]]:
    """Stream the wanted columns of a CSV: yields (first data line number, {logical: array})."""
    names = cols.resolve(csv_header(path), path)
    column_types = {names[k]: t for k, t in types.items() if k in names}
    reader = _arrow_call(path, lambda: pcsv.open_csv(
        path, read_options=pcsv.ReadOptions(block_size=BLOCK),
        convert_options=pcsv.ConvertOptions(include_columns=list(names.values()), column_types=column_types)))
    line = 2
    while True:
        batch = _arrow_call(path, lambda: next(reader, None))
        if batch is None:
            return
        yield line, {k: batch.column(v) for k, v in names.items()}
        line += batch.num_rows


def jsonl_batches(path: Path, cols: Columns, types: Mapping[str, pa.DataType]) -> Iterator[tuple[int, dict[str, pa.Array]]]:
    """Stream the wanted fields of a JSON-lines file: yields (first line number, {logical: array})."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if not head.strip():
        raise UserError("empty file (expected JSON lines)", path)
    if head.lstrip()[:1] != b"{":
        raise UserError("not JSON lines (each line must be one JSON object)", path)
    reader = _arrow_call(path, lambda: pjson.open_json(path, read_options=pjson.ReadOptions(block_size=BLOCK)))
    names = cols.resolve(reader.schema.names, path)
    line = 1
    while True:
        batch = _arrow_call(path, lambda: next(reader, None))
        if batch is None:
            return
        out = {}
        for k, v in names.items():
            col = batch.column(v)
            if k in types and not col.type.equals(types[k]):
                col = _cast(col, types[k], path, v, line)
            out[k] = col
        yield line, out
        line += batch.num_rows


def _cast(col: pa.Array, type_: pa.DataType, path: Path, name: str, line: int) -> pa.Array:
    try:
        return col.cast(type_)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        bad = _first_bad(col, type_)
        raise UserError(f"line {line + bad}: field {name!r} is not {type_} ({col[bad].as_py()!r})", path) from None


def _first_bad(col: pa.Array, type_: pa.DataType) -> int:
    for i in range(len(col)):  # only on the error path
        try:
            col.slice(i, 1).cast(type_)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return i
    return 0


def _arrow_call(path: Path, fn: Any) -> Any:
    try:
        return fn()
    except StopIteration:
        return None
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise UserError(_arrow_message(exc), path) from None


def _arrow_message(exc: Exception) -> str:
    text = str(exc).splitlines()[0]
    # "In CSV column #1: Row #5: CSV conversion error to int64: invalid value 'x'" -> keep as is, it names the row
    return text.replace("CSV conversion error to", "cannot read as")


def numbers(col: pa.Array, name: str, path: Path, line: int, *, dtype: Any = np.int64,
            allow_negative: bool = False) -> np.ndarray:
    """A numeric column as NumPy, refusing nulls and (by default) negative values, naming the line."""
    if col.null_count:
        bad = int(pc.index(pc.is_null(col), True).as_py())
        raise UserError(f"line {line + bad}: column {name!r} is empty", path)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        ok = pc.match_substring_regex(col.cast(pa.string()), r"^\s*-?\d+(\.\d*)?([eE][-+]?\d+)?\s*$")
        if not pc.all(ok).as_py():
            bad = int(pc.index(ok, False).as_py())
            raise UserError(f"line {line + bad}: column {name!r} is not a number ({col[bad].as_py()!r})", path)
        col = col.cast(pa.float64())
    arr = col.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    if not allow_negative and arr.size and arr.min() < 0:
        bad = int(np.argmax(arr < 0))
        raise UserError(f"line {line + bad}: column {name!r} is negative ({arr[bad]})", path)
    result: np.ndarray = arr
    return result


_TS_REST = r"^(?:\.(?P<frac>\d{1,9}))?(?P<tz>Z|[+-]\d\d:?\d\d)?$"


def timestamps_ns(col: pa.Array, name: str, path: Path, line: int) -> np.ndarray:
    """Parse date-time strings to UTC nanoseconds, vectorised.

    Accepts ``YYYY-MM-DD HH:MM:SS`` or ``...THH:MM:SS``, an optional fraction
    of 1-9 digits (Azure 2023 writes 7), and an optional ``Z`` or ``+HH:MM``
    offset (Azure 2024 writes ``+00:00`` and drops the fraction when it is
    zero; Azure 2025 writes ``Z``). Naive times are taken as UTC.
    """
    if pa.types.is_timestamp(col.type):
        result: np.ndarray = col.cast(pa.timestamp("ns")).cast(pa.int64()).to_numpy(zero_copy_only=False)
        return result
    s = col.cast(pa.string())
    main = pc.replace_substring(pc.utf8_slice_codeunits(s, 0, 19), "T", " ")
    secs = pc.strptime(main, format="%Y-%m-%d %H:%M:%S", unit="s", error_is_null=True)
    rest = pc.extract_regex(pc.utf8_slice_codeunits(s, 19, 64), _TS_REST)
    bad = pc.or_kleene(pc.is_null(secs), pc.is_null(rest))
    bad = pc.or_kleene(bad, pc.is_null(s))
    if pc.any(bad).as_py():
        i = int(pc.index(bad, True).as_py())
        raise UserError(f"line {line + i}: column {name!r} has a bad timestamp {s[i].as_py()!r}", path)
    frac = pc.utf8_rpad(pc.struct_field(rest, "frac"), width=9, padding="0").cast(pa.int64()).to_numpy()
    tz = pc.struct_field(rest, "tz").to_numpy(zero_copy_only=False)
    ns = secs.cast(pa.int64()).to_numpy() * 1_000_000_000 + frac
    offset = np.zeros(len(ns), dtype=np.int64)
    has_offset = (tz != "") & (tz != "Z")
    if has_offset.any():
        for text in np.unique(tz[has_offset]):  # a handful of distinct offsets at most
            digits = text.replace(":", "")
            sign = -1 if digits[0] == "-" else 1
            offset[tz == text] = sign * (int(digits[1:3]) * 3600 + int(digits[3:5]) * 60) * 1_000_000_000
    epoch_ns: np.ndarray = ns - offset
    return epoch_ns


def assemble(arrival_s: np.ndarray, input_tokens: np.ndarray, output_tokens: np.ndarray, *,
             source: Path, **columns: Any) -> pa.Table:
    """A TRACE table sorted by arrival (stable), numbered from 0, arrivals starting at 0.

    ``columns`` may hold any other TRACE column as an array or Arrow array;
    a ``parent_row`` array (row index of the parent in the *input* order, -1
    for none) becomes ``parent_id`` in the new numbering.
    """
    n = len(arrival_s)
    if n == 0:
        raise UserError("no requests in the file", source)
    order = np.argsort(arrival_s, kind="stable")
    start = arrival_s[order[0]]
    out: dict[str, Any] = {
        "request_id": np.arange(n, dtype=np.int64),
        "arrival_s": arrival_s[order] - start,
        "input_tokens": _int32(input_tokens[order], "input_tokens", source),
        "output_tokens": _int32(output_tokens[order], "output_tokens", source),
    }
    parent_row = columns.pop("parent_row", None)
    if parent_row is not None:
        new_id = np.empty(n, dtype=np.int64)
        new_id[order] = np.arange(n)
        p = parent_row[order]
        out["parent_id"] = pa.array(np.where(p >= 0, new_id[np.maximum(p, 0)], 0), pa.int64(), mask=p < 0)
    for name, values in columns.items():
        if values is None:
            continue
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            out[name] = values.take(pa.array(order))
        else:
            out[name] = np.asarray(values)[order]
    table = pa.table({k: (v if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(v)) for k, v in out.items()})
    return TRACE.conform(table, source)


def _int32(values: np.ndarray, name: str, source: Path) -> np.ndarray:
    if values.size and values.max() > np.iinfo(np.int32).max:
        raise UserError(f"column {name!r} has values beyond 2^31", source)
    return values.astype(np.int32)


def dictionary(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Dictionary-encode a string column (tenants, kinds): small on disk, cheap to group by."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return pc.dictionary_encode(values.cast(pa.string())).cast(pa.dictionary(pa.int32(), pa.string()))


#: header spellings of a per-request LoRA adapter column, which any importer reads where present
ADAPTER_NAMES = ("adapter", "lora", "lora_name", "lora_adapter", "adapter_id", "lora_id")


def adapters(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    """An adapter column as the trace's ``adapter``: dictionary strings, null (the base model)
    where the cell is empty; ids written as numbers become their decimal text."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    text = values.cast(pa.string())
    blank = pc.or_kleene(pc.is_null(text), pc.equal(pc.utf8_trim_whitespace(text), ""))
    return dictionary(pc.if_else(blank, pa.scalar(None, pa.string()), text))


def concat(chunks: list[Any]) -> Any:
    """Join per-batch pieces (NumPy arrays or Arrow arrays)."""
    if chunks and isinstance(chunks[0], (pa.Array, pa.ChunkedArray)):
        return pa.chunked_array(chunks).combine_chunks()
    return np.concatenate(chunks) if chunks else np.empty(0)
