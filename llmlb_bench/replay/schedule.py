"""When each trace request leaves: open loop (with dependent requests) or closed loop.

Open loop: a request leaves at ``arrival_s`` x ``time_scale``. A dependent
request (``parent_id`` naming a request this run sends) waits for its parent
to end, and a join also for the requests its ``wait_ids`` name; it leaves
``after_parent_s`` x ``time_scale`` after the last of them ends, or at its
own arrival time if that is later.

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

from llmlb_bench.trace_columns import TraceColumns

INF = float("inf")


class Schedule:
    """The order and times in which the replayer sends the trace's requests."""

    def __init__(self, tr: TraceColumns, skip: set[int], users: int | None = None, think_s: float = 0.0) -> None:
        self.tr = tr
        self.users = users
        self.think_s = think_s
        #: scheduled time of each row (a dependent's is fixed when its parent ends)
        self.due = list(tr.arrival)
        #: rows handed out (or skipped because a resumed run already has them)
        self.taken = [rid in skip for rid in tr.rid]
        #: row -> the rows waiting for it, and how many rows each still waits for (open loop only;
        #: a row a resumed run already has releases nothing and is waited for by nothing)
        self._children: dict[int, list[int]] = {}
        self._pending = [0] * tr.n
        if users is None:
            self._children, self._pending, free = tr.dependencies(self.taken)
            roots = free.tolist()
        else:
            roots = [i for i in range(tr.n) if not self.taken[i]]
        roots.sort(key=lambda i: (self.due[i], i))
        self._roots = roots
        self._pos = 0
        self._ready: list[tuple[float, int]] = []
        self.waiting = sum(1 for p in self._pending if p)
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
        kids = self._children.pop(idx, None)
        released = False
        for c in kids or ():
            self._pending[c] -= 1
            if not self._pending[c]:  # the last request it waits for: leave after_parent_s later
                self.due[c] = max(self.due[c], end + self.tr.after[c])
                heapq.heappush(self._ready, (self.due[c], c))
                self.waiting -= 1
                released = True
        return released

    def untaken(self) -> list[int]:
        """Rows never handed out (written as not_sent after an interrupt); marks them taken."""
        rest = [i for i, t in enumerate(self.taken) if not t]
        for i in rest:
            self.taken[i] = True
        return rest
