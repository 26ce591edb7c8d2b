"""Heterogeneous and disaggregated fleets.

* ``capacity_weighted``: mixed GPU pools (say H100s beside A100s) serve at
  different speeds, so equal request counts overload the slow ones. Each
  target carries ``TargetInfo.capacity`` (relative serving speed, from the
  cost model or a calibration); the policy joins the queue with the least
  load per unit capacity, or, with ``load = none``, spreads requests in
  proportion to capacity by smooth weighted round-robin (nginx's algorithm:
  the sequence for weights 5,1,1 is a a b a c a a, not a a a a a b c).
* ``pd_pair``: prefill/decode disaggregation (DistServe, OSDI 2024;
  Splitwise, ISCA 2024) runs the two phases on separate pools. The
  controller sends each request to the prefill instance with the shortest
  queue and its decode phase to the least loaded decode instance.

What ``pd_pair`` needs from the view: targets tagged ``TargetInfo.pool`` =
``"prefill"`` or ``"decode"`` (names configurable), and per-target
in-flight counts in which the backend counts a request on its prefill
target until its KV cache is handed over and on its decode target until it
finishes (``policies.base.on_dispatch`` / ``on_finish`` per phase). The backend calls
``choose_pair(req, view) -> (prefill_target, decode_target)``. On a fleet
without both pools, ``choose`` is plain JSQ over all targets.
"""

from __future__ import annotations

from typing import Sequence

from llmlb_bench.policies.base import REJECT, PairDecision, Policy, RouteRequest, View
from llmlb_bench.policies.select import argmin_healthy


class CapacityWeighted(Policy):
    name = "capacity_weighted"
    summary = "Mixed pools: least (load + 1) / capacity, or smooth weighted round-robin by capacity (load=none)."
    params = {"load": ("requests", "requests or tokens (own accounting), or none for weighted round-robin")}

    def __init__(self, load: str = "requests") -> None:
        if load not in ("requests", "tokens", "none"):
            raise ValueError(f"load must be requests, tokens or none (got {load!r})")
        self.load = load
        self._current: list[float] = []
        self._tie = 0

    def choose(self, req: RouteRequest, view: View) -> int:
        if self.load == "none":
            return self._weighted_round_robin(view)
        loads = view.outstanding_requests if self.load == "requests" else view.outstanding_tokens
        self._tie += 1
        n = len(view)
        best, best_v = -1, 0.0
        for k in range(n):
            i = (self._tie + k) % n
            if not view.healthy[i]:
                continue
            v = (loads[i] + 1) / max(view.targets[i].capacity, 1e-12)
            if best < 0 or v < best_v:
                best, best_v = i, v
        return best if best >= 0 else self._tie % n

    def _weighted_round_robin(self, view: View) -> int:
        """nginx smooth WRR: add each weight to its counter, pick the largest, subtract the total."""
        n = len(view)
        if len(self._current) != n:
            self._current = [0.0] * n
        total, best = 0.0, -1
        for i in range(n):
            if not view.healthy[i]:
                continue
            w = view.targets[i].capacity
            self._current[i] += w
            total += w
            if best < 0 or self._current[i] > self._current[best]:
                best = i
        if best < 0:
            return 0
        self._current[best] -= total
        return best


class PrefillDecodePair(Policy):
    name = "pd_pair"
    summary = "Disaggregated P/D (DistServe/Splitwise): shortest-queue prefill instance + least-loaded decode instance."
    params = {
        "prefill_pool": ("prefill", "TargetInfo.pool of prefill instances"),
        "decode_pool": ("decode", "TargetInfo.pool of decode instances"),
        "decode_load": ("tokens", "decode load measure: tokens (KV held) or requests"),
    }

    def __init__(self, prefill_pool: str = "prefill", decode_pool: str = "decode", decode_load: str = "tokens") -> None:
        if decode_load not in ("tokens", "requests"):
            raise ValueError(f"decode_load must be tokens or requests (got {decode_load!r})")
        self.prefill_pool, self.decode_pool, self.decode_load = prefill_pool, decode_pool, decode_load
        self._tie = 0

    def _shortest(self, values: Sequence[int], view: View, pool: str) -> int:
        n = len(view)
        best, best_v = -1, 0
        for k in range(n):
            i = (self._tie + k) % n
            if view.healthy[i] and view.targets[i].pool == pool and (best < 0 or values[i] < best_v):
                best, best_v = i, values[i]
        return best

    def choose_pair(self, req: RouteRequest, view: View) -> PairDecision:
        """(prefill target, decode target); REJECT when a pool has no healthy member."""
        self._tie += 1
        prefill = self._shortest(view.outstanding_requests, view, self.prefill_pool)
        decode_values = view.outstanding_tokens if self.decode_load == "tokens" else view.outstanding_requests
        decode = self._shortest(decode_values, view, self.decode_pool)
        return REJECT if prefill < 0 or decode < 0 else (prefill, decode)

    def choose(self, req: RouteRequest, view: View) -> int:
        self._tie += 1
        return argmin_healthy(view.outstanding_requests, view, self._tie)
