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

Besides a target index, ``choose`` may return one of two :class:`Verdict`
values (a :data:`Decision` is either):

* :data:`REJECT`: the router refuses the request (admission control). The
  backend never sends it and writes it with status ``"rejected"``; the policy
  gets no ``on_complete`` for it.
* :data:`HOLD`: the policy keeps the request in its own router-side queue
  (EDF, shortest-predicted-first). After a HOLD and after every completion
  ``release(view)`` is called until it returns ``None``; each
  ``(request, target)`` it returns is dispatched (or, with target
  :data:`REJECT`, written as rejected) exactly as if ``choose`` had returned it.

Disaggregated clusters (targets whose ``TargetInfo.pool`` is ``"prefill"`` or
``"decode"``) ask policies that have it for ``choose_pair(req, view) ->
(prefill_target, decode_target)`` (or :data:`REJECT`) instead of ``choose``.

Backends never call these hooks themselves: :class:`~llmlb_bench.policies.router.Router`
drives them (the decision, the HOLD queue, the bounds check, the view's accounting),
so the protocol is honoured the same way in the simulator, ``llmlb serve`` and the replayer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Collection, Final, Literal, Optional, Protocol, Sequence, Union


class Verdict(enum.Enum):
    """What ``choose`` returns when it does not name a target."""

    #: refuse the request; it is written with status "rejected" and never sent
    REJECT = "reject"
    #: the policy queued the request; ``release(view)`` hands it out later
    HOLD = "hold"


REJECT: Final = Verdict.REJECT
HOLD: Final = Verdict.HOLD
#: a routing decision: the index of a target, :data:`REJECT` or :data:`HOLD`
Decision = Union[int, Verdict]
#: what ``release`` hands out: a held request and its target (or :data:`REJECT`)
Released = tuple["RouteRequest", Union[int, Literal[Verdict.REJECT]]]
#: what ``choose_pair`` returns: (prefill target, decode target), or :data:`REJECT`
PairDecision = Union[tuple[int, int], Literal[Verdict.REJECT]]


@dataclass(slots=True, frozen=True)
class Outcome:
    """What the backend measured of a request that ended at its target, handed to the policy with
    ``on_complete`` (``RouteRequest.outcome``): the feedback a controller or a learning policy acts on.

    Times are on the backend's clock, the one ``RouteRequest.arrival_s`` and ``View.now`` use, so
    ``first_token_s - arrival_s`` is the TTFT the router saw (its own queueing included). Backends fill
    it only for policies that override ``on_complete`` (:attr:`Router.observes`), so the rest pay nothing.
    """

    #: "ok", "error", "timeout", "rejected" (by the target), as the requests table's status
    status: str
    #: when the first output token reached the router's side; None: no token came
    first_token_s: float | None
    #: when the request ended there (its last token, or the failure)
    end_s: float
    #: output tokens generated
    output_tokens: int
    #: prompt tokens served from the target's prefix cache, where the backend knows it
    cached_tokens: int | None = None


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
    #: the LoRA adapter it names (the OpenAI ``model`` it is sent with); None = the base model
    adapter: str | None = None
    #: set by the Router once a target is chosen: the prompt tokens the policy expected that target
    #: to have cached (``Policy.predicted_cached``); None when the policy makes no such prediction
    predicted_cached_tokens: int | None = None
    #: set by the backend just before ``Router.complete`` when the policy observes outcomes: what the
    #: target delivered (:class:`Outcome`); None before it ended, and for policies that do not observe
    outcome: Outcome | None = None
    #: the turn of its conversation (the trace's ``turn``; None outside conversations)
    turn: int | None = None
    #: the trace's workload kind (chat, code, rag, ...): known at arrival, a predictor's feature
    kind: str = "chat"


@dataclass(slots=True)
class TargetInfo:
    """Static facts about a target."""

    name: str
    pool: str = "default"
    gpu: str = ""
    #: relative serving capacity (e.g. from the cost model), for capacity-weighted policies
    capacity: float = 1.0


class AdapterState(Protocol):
    """A target's LoRA adapters, as vLLM's ``vllm:lora_requests_info`` gauge publishes them:
    the adapters of the requests in its running batch and in its waiting queue, and how many
    distinct adapters one batch may hold (``max_lora``). The simulator's replicas publish their
    own (exact); the replayer's scraper reads the gauge (as stale as the scrape)."""

    @property
    def max_loras(self) -> int: ...
    @property
    def running(self) -> Collection[str]: ...
    @property
    def waiting(self) -> Collection[str]: ...


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
    #: each target's LoRA adapters (None: it publishes none, e.g. it serves no adapters)
    adapters: list[Optional[AdapterState]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.targets)
        if not self.adapters:
            self.adapters = [None] * n
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


class Policy(Protocol):
    """A routing policy: every hook a backend's :class:`~llmlb_bench.policies.router.Router` calls.

    Built-in policies subclass it and inherit the defaults (no completion hook,
    an empty router queue, no ``choose_pair``); a user's class may also just
    have the same methods (structural typing). Only ``choose`` is required.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: parameter name -> (default, one-line meaning); used by ``llmlb policies``
    params: ClassVar[dict[str, tuple[Any, str]]] = {}

    def choose(self, req: RouteRequest, view: View) -> Decision:
        """The target for ``req`` (an index into ``view.targets``), or REJECT, or HOLD."""
        raise NotImplementedError

    def choose_pair(self, req: RouteRequest, view: View) -> PairDecision:
        """(prefill target, decode target) on a disaggregated fleet, or REJECT. Policies that
        cannot pair keep this default; the Router refuses a disaggregated fleet for them."""
        raise NotImplementedError(f"policy {self.name!r} cannot route a disaggregated cluster")

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        """A request routed to ``target`` ended (any status but router-rejected); ``req.outcome`` holds
        what the target delivered (measured TTFT, end, tokens), filled for policies that override this hook."""
        return None

    def release(self, view: View) -> Released | None:
        """Next held request to dispatch and its target (or REJECT); ``None`` when nothing can go now."""
        return None

    def predicted_cached(self, req: RouteRequest, target: int, view: View) -> int | None:
        """Prompt tokens of ``req`` the policy expects ``target`` to serve from its prefix cache, asked
        right after it chose ``target`` (cache-aware policies answer from their index; the Router
        records it as ``predicted_cached_tokens``, so predicted and delivered hits can be compared);
        None: no prediction."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **{k: getattr(self, k, d) for k, (d, _) in self.params.items()}}
