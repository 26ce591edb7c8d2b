"""When each trace request reaches the router: open loop with dependents, or closed loop; one schedule
for the simulator and the replayer.

Open loop: a request arrives at its ``arrival_s`` (scaled by the replayer's
``--time-scale``, already applied in :class:`~llmlb_bench.trace_columns.TraceColumns`).
A dependent request (``parent_id`` naming another row) waits for its parent to
end, and a join also for the rows its ``wait_ids`` name; it arrives
``after_parent_s`` after the last of them ends, or at its own arrival time if
that is later. The rows that wait for nothing are the *roots*.

Closed loop (``users`` = N): N users each send one request, wait for it to
end (any status), think ``think_s`` seconds and send the next row in arrival
order; arrival times then only set that order, and ``parent_id`` is not
used. The first N rows arrive together at the first row's arrival time. This
holds a server at a fixed concurrency, the way concurrency-mode benchmark
clients do, and obeys the interactive response-time law R = N / X - Z.

Both backends take the roots in order (:attr:`TraceSchedule.roots`, the first
:attr:`TraceSchedule.initial` of them on their own; closed loop hands out the
rest one per ended request) and call :meth:`TraceSchedule.ended` when a
request ends; what it releases carries its time in :attr:`TraceSchedule.due`.
Each backend keeps its own clock: the simulator a heap of timed deliveries,
the replayer a real-time dispatcher. Ties of arrival time go in request id order.
"""

from __future__ import annotations

import numpy as np

from llmlb_bench.trace_columns import TraceColumns


class TraceSchedule:
    """The dependency schedule of one run over a trace: roots, dependents, closed-loop users."""

    __slots__ = ("users", "think_s", "due", "taken", "roots", "initial", "waiting", "dependent", "_children",
                 "_pending", "_after", "_next")

    def __init__(self, tr: TraceColumns, skip: set[int] | None = None, users: int | None = None,
                 think_s: float = 0.0) -> None:
        """``skip``: request ids a resumed run already has (they wait for nothing, release nothing and
        are never handed out). ``users``: closed loop with that many users (None: open loop)."""
        self.users = users
        self.think_s = think_s
        #: per row, when it arrives at the router (a dependent's, or a closed-loop row's, is fixed when released)
        self.due: list[float] = list(tr.arrival)
        #: per row, whether it has been handed to the router (or skipped because a resumed run has it)
        self.taken: list[bool] = [rid in skip for rid in tr.rid] if skip else [False] * tr.n
        #: row -> the rows waiting for it, and how many rows each still waits for (open loop only)
        self._children: dict[int, list[int]] = {}
        self._pending: list[int] = [0] * tr.n
        if users is None:
            self._children, self._pending, free = tr.dependencies(self.taken if skip else None)
        else:
            free = np.flatnonzero(~np.asarray(self.taken, dtype=bool))
        #: ``after_parent_s`` per row, read only when a row has dependents (a column most traces lack
        #: or leave at 0, converted into a list at the first read)
        self._after: list[float] = tr.after if self._children else []
        order = np.lexsort((np.asarray(tr.rid, dtype=np.int64)[free], tr.arrival_np[free]))
        #: the rows that wait for no other row, in arrival order (ties: request id)
        self.roots: list[int] = free[order].tolist()
        #: how many of :attr:`roots` arrive on their own (closed loop: one per user; the rest follow ends)
        self.initial = len(self.roots) if users is None else min(users, len(self.roots))
        self._next = self.initial
        if users is not None and self.roots:
            start = self.due[self.roots[0]]
            for i in self.roots[:self.initial]:
                self.due[i] = start
        #: whether any request's arrival depends on another's end (open loop with dependents, or closed loop)
        self.dependent = users is not None or bool(self._children)
        #: rows not yet released: dependents still waiting, closed-loop rows no user has reached
        self.waiting = (len(self.roots) - self.initial if users is not None
                        else sum(1 for p in self._pending if p))

    def first_due(self) -> float:
        """The earliest arrival among the roots (0 when there are none): where a resumed run restarts."""
        return self.due[self.roots[0]] if self.roots else 0.0

    def ended(self, row: int, end: float) -> list[int]:
        """Row ``row`` ended at ``end`` (any status): the rows that released, each arriving at ``due[row]``
        (its dependents whose last awaited row this was; closed loop: its user's next row)."""
        if self.users is not None:
            k = self._next
            if k >= len(self.roots):
                return []
            self._next = k + 1
            nxt = self.roots[k]
            self.due[nxt] = end + self.think_s
            self.waiting -= 1
            return [nxt]
        kids = self._children.pop(row, None)
        if not kids:
            return []
        pending, due, after = self._pending, self.due, self._after
        released = []
        for c in kids:
            pending[c] -= 1
            if not pending[c]:  # the last request it waits for: arrive after_parent_s later
                due[c] = max(due[c], end + after[c])
                released.append(c)
        self.waiting -= len(released)
        return released

    def children(self, row: int) -> list[int]:
        """The rows still waiting for ``row`` (open loop; empty once it has ended)."""
        return self._children.get(row, [])

    def untaken(self) -> list[int]:
        """Rows never handed to the router (the run ended or was interrupted first, or what they waited
        for was never sent), in row order; marks them taken."""
        taken = self.taken
        rest = [i for i, t in enumerate(taken) if not t]
        for i in rest:
            taken[i] = True
        return rest
