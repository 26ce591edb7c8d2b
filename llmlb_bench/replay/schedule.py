"""When each trace request leaves: open loop (with dependent requests) or closed loop.

Open loop: a request leaves at ``arrival_s`` x ``time_scale``. A dependent
request (``parent_id`` naming a request this run sends) waits for its parent
to end and leaves ``after_parent_s`` x ``time_scale`` later, or at its own
arrival time if that is later.

Closed loop (``users`` = N): N users each send one request, wait for it to
end, think ``think_s`` seconds and send the next row of the trace (in
arrival order); arrival times then only set that order, and ``parent_id``
is not used. This measures a server at a fixed concurrency, the way
concurrency-mode benchmark clients do.

Roots are sorted once; released requests go through a heap, so picking
the next request costs O(log n).
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import pyarrow as pa

INF = float("inf")


class TraceColumns:
    """The trace as plain Python lists (fast per-request access on the event loop)."""

    def __init__(self, table: pa.Table, scale: float) -> None:
        col = table.column
        self.n = table.num_rows
        self.rid: list[int] = col("request_id").to_pylist()
        self.due: list[float] = [a * scale for a in col("arrival_s").to_pylist()]
        self.inp: list[int] = col("input_tokens").to_pylist()
        self.out: list[int] = col("output_tokens").to_pylist()
        self.tenant = _strings(table, "tenant", "default")
        self.slo = _strings(table, "slo_class", "default")
        self.session = _values(table, "session_id", None)
        self.priority = _values(table, "priority", 0)
        self.parent = _values(table, "parent_id", None)
        self.after = [(a or 0.0) * scale for a in _values(table, "after_parent_s", 0.0)]
        self.images: list[int] = _values(table, "images", 0)
        self.image_tokens: list[int] = _values(table, "image_tokens", 0)
        self.audio_s: list[float] = _values(table, "audio_s", 0.0)
        if "prefix_hashes" in table.column_names:
            arr = table.column("prefix_hashes").combine_chunks()
            self._offsets = np.asarray(arr.offsets)
            self._hashes = np.asarray(arr.values.to_numpy(zero_copy_only=False), dtype=np.uint64)
        else:
            self._offsets = np.zeros(self.n + 1, dtype=np.int64)
            self._hashes = np.zeros(0, dtype=np.uint64)

    def hashes(self, i: int) -> list[int]:
        return self._hashes[self._offsets[i]:self._offsets[i + 1]].tolist()


def _strings(table: pa.Table, name: str, default: str) -> list[str]:
    if name not in table.column_names:
        return [default] * table.num_rows
    return [v if v is not None else default for v in table.column(name).cast(pa.string()).to_pylist()]


def _values(table: pa.Table, name: str, default: Any) -> list[Any]:
    if name not in table.column_names:
        return [default] * table.num_rows
    return [v if v is not None else default for v in table.column(name).to_pylist()]


class Schedule:
    """The order and times in which the replayer sends the trace's requests."""

    def __init__(self, tr: TraceColumns, skip: set[int], users: int | None = None, think_s: float = 0.0) -> None:
        self.tr = tr
        self.users = users
        self.think_s = think_s
        self.index = {rid: i for i, rid in enumerate(tr.rid)}
        #: scheduled time of each row (a dependent's is fixed when its parent ends)
        self.due = list(tr.due)
        #: rows handed out (or skipped because a resumed run already has them)
        self.taken = [rid in skip for rid in tr.rid]
        self._children: dict[int, list[int]] = {}
        roots = []
        for i in range(tr.n):
            if self.taken[i]:
                continue
            parent = tr.parent[i] if users is None else None
            if parent is not None and parent in self.index and not self.taken[self.index[parent]]:
                self._children.setdefault(parent, []).append(i)
            else:
                roots.append(i)
        roots.sort(key=lambda i: (tr.due[i], i))
        self._roots = roots
        self._pos = 0
        self._ready: list[tuple[float, int]] = []
        self.waiting = sum(len(v) for v in self._children.values())
        if users is not None:  # closed loop: the first N rows leave together, the rest wait for a user
            start = self.due[roots[0]] if roots else 0.0
            for i in roots[:users]:
                self.due[i] = start
                heapq.heappush(self._ready, (start, i))
            self._pos = min(users, len(roots))
            self.waiting = len(roots) - self._pos

    def first_due(self) -> float:
        """Earliest time among requests that can leave now (0 when there are none)."""
        return self.due[self._roots[0]] if self._roots else 0.0

    def peek(self) -> float:
        """Time of the next request that can leave (INF: none until a request ends)."""
        if self.users is not None:
            return self._ready[0][0] if self._ready else INF
        nxt = self.due[self._roots[self._pos]] if self._pos < len(self._roots) else INF
        return min(nxt, self._ready[0][0]) if self._ready else nxt

    def pop(self) -> int:
        """The next request (call after :meth:`peek` gave a finite time)."""
        if self._ready and (self.users is not None or self._pos >= len(self._roots)
                            or self._ready[0][0] < self.due[self._roots[self._pos]]):
            idx = heapq.heappop(self._ready)[1]
        else:
            idx = self._roots[self._pos]
            self._pos += 1
        self.taken[idx] = True
        return idx

    def ended(self, idx: int, end: float) -> bool:
        """Request ``idx`` ended at ``end``: release its dependents (closed loop: its user's next
        request); True if that made a request ready."""
        if self.users is not None:
            if self._pos >= len(self._roots):
                return False
            nxt = self._roots[self._pos]
            self._pos += 1
            self.due[nxt] = end + self.think_s
            heapq.heappush(self._ready, (self.due[nxt], nxt))
            self.waiting -= 1
            return True
        kids = self._children.pop(self.tr.rid[idx], None)
        if not kids:
            return False
        for c in kids:
            self.due[c] = max(self.due[c], end + self.tr.after[c])
            heapq.heappush(self._ready, (self.due[c], c))
        self.waiting -= len(kids)
        return True

    def untaken(self) -> list[int]:
        """Rows never handed out (written as not_sent after an interrupt); marks them taken."""
        rest = [i for i, t in enumerate(self.taken) if not t]
        for i in rest:
            self.taken[i] = True
        return rest
