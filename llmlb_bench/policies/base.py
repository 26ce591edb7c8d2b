"""The routing-policy interface shared by the simulator and the HTTP replayer.

A policy sees a :class:`View` of the targets (replicas or endpoints) holding
only what a real router could know:

* its own accounting, exact and fresh: requests and tokens it has sent to each
  target that have not finished yet;
* signals scraped from the targets (queue length, running batch, KV-cache
  use), refreshed every ``refresh_s`` seconds and therefore possibly stale:
  ``signal_time[i]`` says when target ``i``'s signals were last read;
* health.

The backend owns the view and updates its lists in place (no per-decision
allocation, which matters at a million decisions per simulated run). The
policy returns the index of the chosen target, and is told when a request it
routed completes, so that stateful policies (prefix indexes, session maps)
can keep their own books.

Besides a target index, ``choose`` may return two sentinels, which backends
must honour:

* :data:`REJECT`: the router refuses the request (admission control). The
  backend never sends it and writes it with status ``"rejected"``; the policy
  gets no ``on_complete`` for it.
* :data:`HOLD`: the policy keeps the request in its own router-side queue
  (EDF, shortest-predicted-first). After a HOLD and after every completion
  the backend calls ``release(view)`` until it returns ``None``; each
  ``(request, target)`` it returns is dispatched (or, with target
  :data:`REJECT`, written as rejected) exactly as if ``choose`` had returned it.

Disaggregated clusters (targets whose ``TargetInfo.pool`` is ``"prefill"`` or
``"decode"``) ask policies that have it for ``choose_pair(req, view) ->
(prefill_target, decode_target)`` instead of ``choose``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional, Protocol, Sequence

#: ``choose`` result: refuse the request; the backend writes status "rejected" and never sends it.
REJECT = -1
#: ``choose`` result: the policy queued the request; the backend must drain ``release(view)``.
HOLD = -2


@dataclass(slots=True)
class RouteRequest:
    """What a router knows about a request when it arrives."""

    request_id: int
    arrival_s: float
    input_tokens: int
    #: the requested ``max_tokens``; a router does not know the real output length
    max_output_tokens: int
    tenant: str = "default"
    session_id: int | None = None
    priority: int = 0
    slo_class: str = "default"
    prefix_hashes: Sequence[int] = ()


@dataclass(slots=True)
class TargetInfo:
    """Static facts about a target."""

    name: str
    pool: str = "default"
    gpu: str = ""
    #: relative serving capacity (e.g. from the cost model), for capacity-weighted policies
    capacity: float = 1.0


@dataclass
class View:
    """Live, per-target signals; index ``i`` refers to ``targets[i]``."""

    targets: list[TargetInfo]
    now: float = 0.0
    outstanding_requests: list[int] = field(default_factory=list)
    outstanding_tokens: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    healthy: list[bool] = field(default_factory=list)
    signal_time: list[float] = field(default_factory=list)
    #: tokens per prefix-hash block of the trace (``schema.trace_block_size``)
    block_size: int = 16
    #: exact cache state from KV events, where the backend publishes them:
    #: ``cached_prefix(i, prefix_hashes)`` = leading blocks target ``i`` holds now.
    #: ``None`` means no events; cache-aware policies then use their own approximate index.
    cached_prefix: Optional[Callable[[int, Sequence[int]], int]] = None

    def __post_init__(self) -> None:
        n = len(self.targets)
        for name, zero in (("outstanding_requests", 0), ("outstanding_tokens", 0), ("waiting", 0),
                           ("running", 0), ("kv_usage", 0.0), ("healthy", True), ("signal_time", 0.0)):
            if not getattr(self, name):
                setattr(self, name, [zero] * n)

    def __len__(self) -> int:
        return len(self.targets)

    def on_dispatch(self, i: int, req: RouteRequest) -> None:
        """Own accounting when a request is sent to target ``i``."""
        self.outstanding_requests[i] += 1
        self.outstanding_tokens[i] += req.input_tokens + req.max_output_tokens

    def on_finish(self, i: int, req: RouteRequest) -> None:
        """Own accounting when a request sent to target ``i`` ends (any status)."""
        self.outstanding_requests[i] -= 1
        self.outstanding_tokens[i] -= req.input_tokens + req.max_output_tokens


class RoutingPolicy(Protocol):
    """Chooses a target for each request."""

    name: ClassVar[str]

    def choose(self, req: RouteRequest, view: View) -> int:
        """Return the index of the target for ``req``."""
        ...

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        """Called when a request routed by this policy ends; stateless policies ignore it."""
        ...


class Policy:
    """Convenience base: no-op completion hook, empty router queue, parameter description."""

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: parameter name -> (default, one-line meaning); used by ``llmlb policies``
    params: ClassVar[dict[str, tuple[Any, str]]] = {}

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        return None

    def release(self, view: View) -> tuple[RouteRequest, int] | None:
        """Next held request to dispatch and its target (or REJECT); ``None`` when nothing can go now."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **{k: getattr(self, k, d) for k, (d, _) in self.params.items()}}
