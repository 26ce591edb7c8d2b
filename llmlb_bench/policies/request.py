"""What a router knows of a request when it arrives (:class:`RouteRequest`) and what it learns when
the request ends (:class:`Outcome`); re-exported by :mod:`llmlb_bench.policies.base`.

WHY a module of their own: the simulator's compiled core (compiled_core.py) makes a RouteRequest
per request and reads its fields at every decision and end. Compiled with the core, it is a native
class: the core builds it with one native call and reads its fields as struct members, where an
interpreted dataclass cost a generated ``__init__`` and a generic attribute look-up per read (7%
of a 19k-request simulation, measured). Its ``__init__`` is written out for that reason (a
dataclass's generated one is interpreted even under mypyc); the dataclass decorator still gives
``repr``, ``==`` and ``dataclasses.fields``. Compiled, the fields' types are checked when set:
an ``int`` field takes a Python int (not NumPy's ``int64``), as the type hints always said.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


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


@dataclass(slots=True, init=False)
class RouteRequest:
    """What a router knows about a request when it arrives."""

    request_id: int
    arrival_s: float
    input_tokens: int
    #: the requested ``max_tokens``; a router does not know the real output length
    max_output_tokens: int
    tenant: str
    session_id: int | None
    priority: int
    slo_class: str
    prefix_hashes: Sequence[int]
    #: the LoRA adapter it names (the OpenAI ``model`` it is sent with); None = the base model
    adapter: str | None
    #: set by the Router once a target is chosen: the prompt tokens the policy expected that target
    #: to have cached (``Policy.predicted_cached``); None when the policy makes no such prediction
    predicted_cached_tokens: int | None
    #: set by the backend just before ``Router.complete`` when the policy observes outcomes: what the
    #: target delivered (:class:`Outcome`); None before it ended, and for policies that do not observe
    outcome: Outcome | None
    #: the turn of its conversation (the trace's ``turn``; None outside conversations)
    turn: int | None
    #: the trace's workload kind (chat, code, rag, ...): known at arrival, a predictor's feature
    kind: str

    def __init__(self, request_id: int, arrival_s: float, input_tokens: int, max_output_tokens: int,
                 tenant: str = "default", session_id: int | None = None, priority: int = 0,
                 slo_class: str = "default", prefix_hashes: Sequence[int] = (), adapter: str | None = None,
                 predicted_cached_tokens: int | None = None, outcome: Outcome | None = None,
                 turn: int | None = None, kind: str = "chat") -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.input_tokens = input_tokens
        self.max_output_tokens = max_output_tokens
        self.tenant = tenant
        self.session_id = session_id
        self.priority = priority
        self.slo_class = slo_class
        self.prefix_hashes = prefix_hashes
        self.adapter = adapter
        self.predicted_cached_tokens = predicted_cached_tokens
        self.outcome = outcome
        self.turn = turn
        self.kind = kind
