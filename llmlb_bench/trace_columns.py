"""A trace's columns as plain Python lists: read once, indexed per request by the simulator and the replayer.

Both backends handle one request at a time on a hot loop, where indexing a
Python list is the fastest per-row access there is. This is the one place
that turns a trace table into those lists, builds the
:class:`~llmlb_bench.policies.RouteRequest` a router sees
(:meth:`TraceColumns.route_request`), and links dependent requests to their
parents (:meth:`TraceColumns.dependencies`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from llmlb_bench.policies.base import RouteRequest
from llmlb_bench.policies.lora import adapter_key


#: columns most runs never read: (trace column, default, scaled by the time scale), converted into a
#: list at the first read and kept. Not ``functools.cached_property``, which caches in the instance's
#: ``__dict__``: this module is compiled with mypyc (compiled_core.py), whose classes have none, and
#: with cached_property columns the compiled simulation ran 18x slower (measured)
_LAZY: dict[str, tuple[str, Any, bool]] = {
    "after": ("after_parent_s", 0.0, True), "reasoning": ("reasoning_tokens", 0, False),
    "images": ("images", 0, False), "image_tokens": ("image_tokens", 0, False), "audio_s": ("audio_s", 0.0, False)}


def _strings(col: pa.ChunkedArray, default: str) -> list[str]:
    """A dictionary/string column as Python strings, decoding each distinct value once."""
    arr = col.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        values = arr.dictionary.to_pylist() + [default]
        return [values[i] for i in arr.indices.fill_null(len(values) - 1).to_numpy(zero_copy_only=False).tolist()]
    strings: list[str] = arr.fill_null(default).to_pylist()
    return strings


def _salted(values: np.ndarray, offsets: np.ndarray, adapter: list[str | None]) -> np.ndarray:
    """Prefix hashes of rows that name a LoRA adapter, XOR-ed with the adapter's key
    (:func:`~llmlb_bench.policies.lora.adapter_key`: no KV is shared across adapters)."""
    keys = {a: np.uint64(adapter_key(a)) for a in set(adapter) if a is not None}
    per_row = np.array([keys[a] if a is not None else 0 for a in adapter], dtype=np.uint64)
    out: np.ndarray = values.copy()
    out[offsets[0]:offsets[-1]] ^= np.repeat(per_row, np.diff(offsets))
    return out


def _array(col: pa.ChunkedArray) -> pa.Array:
    """A column as one array: its chunk where it has one (combining copies even a single chunk: a
    few ms per million hashes)."""
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def keyed_prefix_hashes(table: pa.Table) -> pa.Array:
    """A trace's ``prefix_hashes`` as the engines see them: each row's hashes keyed by the LoRA
    adapter it names (unchanged for the base model, and for traces without adapters), as the
    simulator and the routers use them; for code that reads the column itself (cache accounting)."""
    arr = _array(table.column("prefix_hashes"))
    acol = table.column("adapter") if "adapter" in table.column_names else None
    if acol is None or acol.null_count == table.num_rows:
        return arr
    values = np.asarray(arr.values.to_numpy(zero_copy_only=False), dtype=np.uint64)
    salted = _salted(values, np.asarray(arr.offsets), acol.cast(pa.string()).to_pylist())
    return pa.ListArray.from_arrays(arr.offsets, pa.array(salted, pa.uint64()), mask=arr.is_null())


class TraceColumns:
    """The trace's columns; ``scale`` multiplies its times (the replayer's ``--time-scale``)."""

    def __init__(self, table: pa.Table, scale: float = 1.0) -> None:
        self.table = table
        self.n = n = table.num_rows
        self.rid: list[int] = self._ints("request_id", 0)
        arrival = self._col("arrival_s")
        self.arrival_np: np.ndarray = arrival.to_numpy().astype(np.float64) if arrival is not None else np.zeros(n)
        if scale != 1.0:
            self.arrival_np = self.arrival_np * scale
        #: when each request is due, seconds from the start (scaled)
        self.arrival: list[float] = self.arrival_np.tolist()
        self.inp: list[int] = self._ints("input_tokens", 0)
        self.out: list[int] = self._ints("output_tokens", 0)
        self.tenant = self._str("tenant", "default")
        self.slo = self._str("slo_class", "default")
        self.priority: list[int] = self._ints("priority", 0)
        scol = self._col("session_id")
        self.session: list[int | None] = ([None] * n if scol is None or scol.null_count == n
                                          else scol.to_pylist())
        hcol = self._col("prefix_hashes")
        arr = _array(hcol) if hcol is not None else None
        #: whether any row names prefix-cache blocks
        self.has_hashes = arr is not None and arr.null_count < n and len(arr.flatten()) > 0
        acol = self._col("adapter")
        #: per row, the LoRA adapter it names (None: the base model)
        self.adapter: list[str | None] = ([None] * n if acol is None or acol.null_count == n
                                          else acol.cast(pa.string()).to_pylist())
        if arr is not None and self.has_hashes:
            self.hash_offsets = np.asarray(arr.offsets)
            self.hash_values = np.asarray(arr.values.to_numpy(zero_copy_only=False), dtype=np.uint64)
            if acol is not None and acol.null_count < n:
                self.hash_values = _salted(self.hash_values, self.hash_offsets, self.adapter)
        else:
            self.hash_offsets = np.zeros(n + 1, dtype=np.int64)
            self.hash_values = np.zeros(0, dtype=np.uint64)
        #: ``kind`` per row (chat where the trace has none): what every routed request carries
        self.kind: list[str] = self._str("kind", "chat")
        tcol = self._col("turn")
        #: ``turn`` per row (None outside conversations)
        self.turn: list[int | None] = [None] * n if tcol is None or tcol.null_count == n else tcol.to_pylist()
        self._scale = scale
        self._lazy: dict[str, list[Any]] = {}

    # ---- columns ----------------------------------------------------------------------------------

    def _col(self, name: str) -> pa.ChunkedArray | None:
        return self.table.column(name) if name in self.table.column_names else None

    def _ints(self, name: str, default: int) -> list[int]:
        col = self._col(name)
        if col is None:
            return [default] * self.n
        ints: list[int] = col.fill_null(default).to_numpy().tolist()
        return ints

    def _str(self, name: str, default: str) -> list[str]:
        col = self._col(name)
        return [default] * self.n if col is None else _strings(col, default)

    def _values(self, name: str, default: Any) -> list[Any]:
        col = self._col(name)
        if col is None:
            return [default] * self.n
        values: list[Any] = col.fill_null(default).to_pylist()
        return values

    def _column(self, name: str) -> list[Any]:
        """One of the :data:`_LAZY` columns, converted at its first read."""
        values = self._lazy.get(name)
        if values is None:
            column, default, scaled = _LAZY[name]
            values = self._values(column, default)
            if scaled:
                values = [a * self._scale for a in values]
            self._lazy[name] = values
        return values

    @property
    def after(self) -> list[float]:
        """``after_parent_s`` per row (scaled; 0 where none)."""
        return self._column("after")

    @property
    def reasoning(self) -> list[int]:
        """How many of each row's output tokens are reasoning (0 where none)."""
        return self._column("reasoning")

    @property
    def images(self) -> list[int]:
        return self._column("images")

    @property
    def image_tokens(self) -> list[int]:
        return self._column("image_tokens")

    @property
    def audio_s(self) -> list[float]:
        return self._column("audio_s")

    def hashes(self, i: int) -> list[int]:
        """Row ``i``'s prefix-cache block hashes."""
        hashes: list[int] = self.hash_values[self.hash_offsets[i]:self.hash_offsets[i + 1]].tolist()
        return hashes

    # ---- requests ---------------------------------------------------------------------------------

    def route_request(self, i: int, arrival_s: float) -> RouteRequest:
        """What a router knows about row ``i`` when it reaches the router at ``arrival_s``."""
        off = self.hash_offsets
        # every field positionally (no prediction, no outcome yet): keywords made CPython build a dict
        # and match names at each call, a third of the construction's cost (measured)
        return RouteRequest(self.rid[i], arrival_s, self.inp[i], self.out[i], self.tenant[i], self.session[i],
                            self.priority[i], self.slo[i],
                            self.hash_values[off[i]:off[i + 1]].tolist() if self.has_hashes else (),
                            self.adapter[i], None, None, self.turn[i], self.kind[i])

    def _rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The row of each request id in ``ids`` (-1 where no row of the trace has it)."""
        n = self.n
        rid = np.asarray(self.rid, dtype=np.int64)
        sorter = np.argsort(rid, kind="stable")
        pos = np.clip(np.searchsorted(rid, ids, sorter=sorter), 0, n - 1)
        rows = sorter[pos] if n else np.zeros(len(ids), dtype=np.int64)
        return np.where((ids >= 0) & (rid[rows] == ids), rows, -1) if n else rows - 1

    def parent_rows(self) -> np.ndarray:
        """Per row, the row of its parent (``parent_id`` naming another row of the trace), else -1."""
        n = self.n
        parent = self._col("parent_id")
        if parent is None or parent.null_count == n:
            return np.full(n, -1, dtype=np.int64)
        prow = self._rows_of(parent.fill_null(-1).to_numpy())
        return np.where(prow != np.arange(n), prow, -1)

    def waited_rows(self) -> dict[int, list[int]]:
        """The rows each dependent row waits for: its parent, then those ``wait_ids`` names (a
        join), each once; ids naming no other row of the trace are left out. Rows that wait for
        nothing are not keys."""
        prow = self.parent_rows()
        linked = np.flatnonzero(prow >= 0)
        deps = {i: [p] for i, p in zip(linked.tolist(), prow[linked].tolist())}
        col = self._col("wait_ids")
        if col is None or col.null_count == self.n:
            return deps
        arr = col.combine_chunks()
        offsets = np.asarray(arr.offsets)
        rows = self._rows_of(np.asarray(arr.values.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64))
        for i in np.flatnonzero(np.diff(offsets)).tolist():
            mine = deps.setdefault(i, [])
            for r in rows[offsets[i]:offsets[i + 1]].tolist():
                if r >= 0 and r != i and r not in mine:
                    mine.append(r)
            if not mine:
                del deps[i]
        return deps

    def dependencies(self, skip: list[bool] | None = None) -> tuple[dict[int, list[int]], list[int], np.ndarray]:
        """Dependent rows per row they wait for (a parent, or a join's other inputs), how many
        rows each row still waits for (it is released when that reaches 0, after the last of
        them ends), and the rows that arrive on their own. A row in ``skip`` (one a resumed run
        already has) waits for nothing and releases nothing, and is not among the independent."""
        children: dict[int, list[int]] = {}
        pending = [0] * self.n
        for row, deps in sorted(self.waited_rows().items()):
            if skip is not None and skip[row]:
                continue
            for d in deps:
                if skip is None or not skip[d]:
                    children.setdefault(d, []).append(row)
                    pending[row] += 1
        free = np.asarray(pending) == 0
        if skip is not None:
            free &= ~np.asarray(skip, dtype=bool)
        return children, pending, np.flatnonzero(free)
