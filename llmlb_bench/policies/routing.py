"""Classic routing policies (load-oblivious and load-aware)."""

from __future__ import annotations

from llmlb_bench.policies.base import Policy, RouteRequest, View


def _argmin_healthy(values: list, view: View, start: int = 0) -> int:
    """Index of the smallest value among healthy targets; ties go to the first
    healthy index at or after ``start`` (rotating tie-breaks avoid always
    favouring target 0 when several targets are idle)."""
    n = len(values)
    best, best_v = -1, None
    for k in range(n):
        i = (start + k) % n
        if not view.healthy[i]:
            continue
        v = values[i]
        if best_v is None or v < best_v:
            best, best_v = i, v
    return best if best >= 0 else start % n


class RoundRobin(Policy):
    name = "round_robin"
    summary = "Cycle through healthy targets in order; ignores load."

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: RouteRequest, view: View) -> int:
        n = len(view)
        for _ in range(n):
            i = self._next % n
            self._next += 1
            if view.healthy[i]:
                return i
        return self._next % n


class LeastOutstanding(Policy):
    name = "least_outstanding"
    summary = "Join the shortest queue: fewest in-flight requests by the router's own count (JSQ)."

    def __init__(self) -> None:
        self._tie = 0

    def choose(self, req: RouteRequest, view: View) -> int:
        self._tie += 1
        return _argmin_healthy(view.outstanding_requests, view, self._tie)
