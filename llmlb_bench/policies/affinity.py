"""Session affinity by consistent hashing (Karger et al. 1997), optionally
with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018, as in Envoy and
HAProxy).

Requests of one conversation land on the same replica, so the replica's
prefix cache holds the conversation's history; adding or removing a replica
moves only about 1/n of the sessions. Without a load bound a few heavy
sessions can pile onto one replica; ``load_factor`` c > 1 caps every replica
at ceil(c x mean load) and walks the ring past full ones.
"""

from __future__ import annotations

import bisect
import hashlib
import math

from llmlb_bench.policies.base import Policy, RouteRequest, View

_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64 finaliser: a fast, well-spread 64-bit hash of an integer key."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _hash_str(s: str) -> int:
    """Stable across processes (Python's ``hash`` of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "little")


class ConsistentHash(Policy):
    name = "consistent_hash"
    summary = "Session affinity on a hash ring with virtual nodes (key: session, else tenant, else request)."
    params = {
        "key": ("session", "first key to try: session (then tenant, then request), tenant (then request), request"),
        "virtual_nodes": (160, "points per target on the ring (ketama's 160)"),
        "load_factor": (0.0, "bounded loads: skip targets above load_factor x mean in-flight; 0 = unbounded"),
    }

    _KEYS = ("session", "tenant", "request")

    def __init__(self, key: str = "session", virtual_nodes: int = 160, load_factor: float = 0.0) -> None:
        if key not in self._KEYS:
            raise ValueError(f"key must be one of {', '.join(self._KEYS)} (got {key!r})")
        if virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be >= 1 (got {virtual_nodes})")
        if load_factor != 0 and load_factor < 1:
            raise ValueError(f"load_factor must be 0 (off) or >= 1 (got {load_factor})")
        self.key, self.virtual_nodes, self.load_factor = key, virtual_nodes, load_factor
        self._points: list[int] = []
        self._owners: list[int] = []
        self._ring_for: tuple[object, int] = (None, 0)  # (targets list, its length) the ring was built for
        self._tenant_hash: dict[str, int] = {}

    def _build(self, view: View) -> None:
        ring = sorted(
            (_hash_str(f"{t.name}#{v}"), i) for i, t in enumerate(view.targets) for v in range(self.virtual_nodes)
        )
        self._points = [p for p, _ in ring]
        self._owners = [i for _, i in ring]
        self._ring_for = (view.targets, len(view.targets))

    def key_hash(self, req: RouteRequest) -> int:
        """Hash of the affinity key: session id, else a non-default tenant, else the request id."""
        if self.key == "session" and req.session_id is not None:
            return _mix64(req.session_id)
        if self.key != "request" and req.tenant != "default":
            h = self._tenant_hash.get(req.tenant)
            if h is None:
                h = self._tenant_hash[req.tenant] = _hash_str("tenant:" + req.tenant)
            return h
        return _mix64(req.request_id ^ 0x5DEECE66D)

    def choose(self, req: RouteRequest, view: View) -> int:
        n = len(view)
        if self._ring_for[0] is not view.targets or self._ring_for[1] != n:
            self._build(view)
        cap = math.inf
        if self.load_factor:
            live = sum(view.healthy) or n
            cap = math.ceil(self.load_factor * (sum(view.outstanding_requests) + 1) / live)
        start = bisect.bisect_left(self._points, self.key_hash(req))
        size = len(self._points)
        seen = 0
        fallback = -1
        for k in range(size):
            i = self._owners[(start + k) % size]
            if seen >> i & 1:
                continue
            seen |= 1 << i
            if not view.healthy[i]:
                continue
            if view.outstanding_requests[i] + 1 <= cap:
                return i
            if fallback < 0:
                fallback = i
            if seen.bit_count() == n:
                break
        return fallback if fallback >= 0 else self._owners[start % size]
