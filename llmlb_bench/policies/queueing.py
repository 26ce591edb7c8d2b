"""Router-side queues: hold requests at the router, release them in an order.

Ordering only matters where requests wait, and a router that forwards every
request at once leaves all waiting to the engines. Routers with flow control
(llm-d's flow controller, Mooncake's conductor, any gateway with a
per-backend concurrency limit) instead hold requests while every backend is
at its limit, and then the release order is a policy: first come first
served, earliest deadline first, shortest predicted job first.

Protocol (see :mod:`llmlb_bench.policies.base`): ``choose`` returns a target
when one is below ``max_outstanding`` and nothing is already waiting, else
:data:`HOLD`. The backend then calls ``release(view)`` after the HOLD and
after every completion, dispatching each ``(request, target)`` it gets until
it returns ``None``; target :data:`REJECT` means the router dropped the
request (EDF with ``drop_late``: its deadline passed while it waited).
Released requests go to the target with the fewest in flight.
"""

from __future__ import annotations

import heapq

from llmlb_bench.policies.base import HOLD, REJECT, Decision, Policy, Released, RouteRequest, View
from llmlb_bench.policies.predictor import OutputLengths


class RouterQueue(Policy):
    """Hold at the router when every target is at ``max_outstanding``; release by :meth:`key`."""

    name = "fcfs_queue"
    summary = "Router-side FCFS queue: hold requests while every target has max_outstanding in flight."
    params = {"max_outstanding": (64, "per-target in-flight limit (own count); above it requests wait at the router")}

    def __init__(self, max_outstanding: int = 64) -> None:
        if max_outstanding < 1:
            raise ValueError(f"max_outstanding must be >= 1 (got {max_outstanding})")
        self.max_outstanding = max_outstanding
        self._heap: list[tuple[float, int, RouteRequest]] = []
        self._seq = 0
        self._tie = 0

    def key(self, req: RouteRequest) -> float:
        """Release order: smaller first (FCFS: arrival time); ties by arrival order."""
        return req.arrival_s

    def late(self, req: RouteRequest, view: View) -> bool:
        """Whether a held request should be dropped instead of sent."""
        return False

    @property
    def held(self) -> int:
        """Requests waiting at the router now."""
        return len(self._heap)

    def _room(self, view: View) -> int:
        """Healthy target with the fewest in flight, if it is below the limit; else -1."""
        self._tie += 1
        n = len(view)
        best, best_load = -1, self.max_outstanding
        for k in range(n):
            i = (self._tie + k) % n
            load = view.outstanding_requests[i]
            if view.healthy[i] and load < best_load:
                best, best_load = i, load
        return best

    def choose(self, req: RouteRequest, view: View) -> Decision:
        if not self._heap:
            target = self._room(view)
            if target >= 0:
                return target
        heapq.heappush(self._heap, (self.key(req), self._seq, req))
        self._seq += 1
        return HOLD

    def release(self, view: View) -> Released | None:
        if not self._heap:
            return None
        req = self._heap[0][2]
        if self.late(req, view):
            heapq.heappop(self._heap)
            return req, REJECT
        target = self._room(view)
        if target < 0:
            return None
        heapq.heappop(self._heap)
        return req, target


class EarliestDeadlineFirst(RouterQueue):
    """Release the request whose deadline (arrival + its class's deadline) comes first.

    EDF is optimal for meeting deadlines on one server when the load is
    feasible (Liu & Layland 1973); under overload it degrades badly, which
    is what ``drop_late`` is for: a request already past its deadline is
    dropped at the router instead of taking capacity from ones still on time.
    """

    name = "edf"
    summary = "Router-side queue released earliest deadline first (deadline = arrival + per-class deadline)."
    params = {
        **RouterQueue.params,
        "deadline_s": (2.0, "deadline after arrival for classes not listed in deadlines"),
        "deadlines": ("", "per-class deadlines, e.g. 'interactive=0.5,batch=60' (slo_class=seconds)"),
        "drop_late": (False, "reject held requests whose deadline has passed"),
    }

    def __init__(self, max_outstanding: int = 64, deadline_s: float = 2.0, deadlines: str = "",
                 drop_late: bool = False) -> None:
        super().__init__(max_outstanding)
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0 (got {deadline_s})")
        self.deadline_s, self.deadlines, self.drop_late = deadline_s, deadlines, drop_late
        self._by_class = parse_deadlines(deadlines)

    def deadline(self, req: RouteRequest) -> float:
        return req.arrival_s + self._by_class.get(req.slo_class, self.deadline_s)

    def key(self, req: RouteRequest) -> float:
        return self.deadline(req)

    def late(self, req: RouteRequest, view: View) -> bool:
        return self.drop_late and view.now > self.deadline(req)


class PredictedShortestFirst(RouterQueue):
    """Release the request with the shortest predicted output first.

    Shortest-job-first minimises mean waiting time when job sizes are known;
    with a predictor of quality ``tau`` (see :class:`KendallOracle`) the gain
    shrinks as tau falls and vanishes at tau = 0, where the order is random.
    With ``predictor=FILE`` a trained predictor replaces the oracle.
    """

    name = "predicted_sjf"
    summary = "Router-side queue released shortest predicted output first (Kendall-tau oracle or trained predictor)."
    params = {
        **RouterQueue.params,
        "tau": (0.5, "Kendall tau of the length predictor against the true output length"),
        "seed": (0, "seed of the predictor's noise"),
        "predictor": ("", "trained predictor file (llmlb learn predictor); replaces the tau oracle"),
    }

    def __init__(self, max_outstanding: int = 64, tau: float = 0.5, seed: int = 0, predictor: str = "") -> None:
        super().__init__(max_outstanding)
        self.tau, self.seed, self.predictor = tau, seed, predictor
        self.lengths = OutputLengths(tau, seed, predictor)

    def key(self, req: RouteRequest) -> float:
        return self.lengths.predict(req, req.max_output_tokens)


def parse_deadlines(text: str) -> dict[str, float]:
    """``'interactive=0.5,batch=60'`` -> ``{'interactive': 0.5, 'batch': 60.0}`` (seconds per slo_class)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        cls, sep, value = part.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not sep or not cls.strip() or seconds <= 0:
            raise ValueError(f"deadlines: expected slo_class=seconds (> 0), got {part!r}")
        out[cls.strip()] = seconds
    return out
