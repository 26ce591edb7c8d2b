"""The one router every backend calls: decisions, the HOLD queue, bounds checks, the view's books.

A :class:`~llmlb_bench.policies.base.Policy` only answers questions. What a
router *does* with the answers is the same in the simulator
(:mod:`llmlb_bench.sim.simulation`), ``llmlb serve`` (:mod:`llmlb_bench.serve.live`)
and the replayer (:mod:`llmlb_bench.replay.runner`), so it lives here once:

* :meth:`Router.route` asks ``choose`` and acts on the :data:`Decision`: a
  target is bounds-checked (a bad one raises :class:`PolicyError`, in every
  backend) and handed to the backend's ``dispatch`` callback; REJECT goes to
  its ``reject`` callback (the two callables, or the two methods of a :class:`Sink`,
  which the compiled core calls natively); HOLD keeps the backend's item in the router queue
  and drains ``release``. :meth:`Router.route_pair` is the same for
  disaggregated fleets (``choose_pair``).
* every request sent to a target carries the policy's prediction of its cached prompt tokens
  there (``RouteRequest.predicted_cached_tokens``, from ``Policy.predicted_cached``), set here just
  before ``dispatch``, so every backend records the same prediction.
* :meth:`Router.drain` hands out what the policy releases (after a HOLD, a
  completion, a replica coming back ...).
* :meth:`Router.sent`, :meth:`Router.left` and :meth:`Router.complete` keep the
  view's own accounting (outstanding requests and tokens) and call
  ``on_complete``; the backend calls them at the moment a request really
  leaves for a target and really ends there. Where :attr:`Router.observes` (the
  policy has its own ``on_complete``), the backend first sets ``req.outcome``
  (:class:`~llmlb_bench.policies.base.Outcome`: measured first token, end, tokens),
  so feedback controllers and learning policies get the same measurements in every backend.

The backend's *item* is whatever it needs to find the request again (a trace
row, a live request, an ``asyncio.Future`` in a proxy); the router only
stores it while the policy holds the request. Use from an aiohttp handler::

    router = Router(policy, view, dispatch=lambda fut, req, i, _d: fut.set_result(i),
                    reject=lambda fut, req, why: fut.set_result(why))
    fut = loop.create_future()
    router.route(fut, req, now)     # resolves at once, or later when the policy releases it
    outcome = await fut             # an int target: router.sent(i, req), proxy, then router.complete(i, req)

A target out of range raises :class:`PolicyError` (a user's policy broke the
contract: the run stops with that one line, in every backend); a request whose
release was refused stays in :attr:`Router.held`, so the backend still writes its row.

Callbacks may re-enter the router (a dispatch that fails at once may
``complete`` and so ``drain`` again); the held item is removed before its
callback runs, so each held request is handed out exactly once.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, NoReturn, TypeVar

from mypy_extensions import mypyc_attr

from llmlb_bench.errors import PolicyError as PolicyError  # defined there (this module is compiled); exported here
from llmlb_bench.policies.base import (HOLD, REJECT, Decision, Picked, Policy, Released, RouteRequest, Verdict, View,
                                       view_books)
from llmlb_bench.policies.books import Pick

Item = TypeVar("Item")

#: ``dispatch(item, request, target, decode_target)``: send the request to ``target``
#: (``decode_target`` >= 0 only for a disaggregated pair)
Dispatch = Callable[[Item, RouteRequest, int, int], None]
#: ``reject(item, request, reason)``: the router refused the request; write it as "rejected"
Reject = Callable[[Item, RouteRequest, str], None]


@mypyc_attr(allow_interpreted_subclasses=True)
class Sink(Generic[Item]):
    """Where the Router sends what it decides: :meth:`dispatch` a request to its target(s), or
    :meth:`reject` it. A base class beside the two callables (:class:`Callbacks`) because the
    trace-run core, compiled with the Router (compiled_core.py), is a Sink the Router then calls
    natively: a bound method kept as a callable is an interpreted call per request."""

    def dispatch(self, item: Item, req: RouteRequest, target: int, decode_target: int) -> None:
        """Send ``req`` to ``target`` (and, disaggregated, its decode to ``decode_target``, else -1)."""
        raise NotImplementedError

    def reject(self, item: Item, req: RouteRequest, why: str) -> None:
        """The router refused ``req``; write it as "rejected", saying ``why``."""
        raise NotImplementedError


class Callbacks(Sink[Item]):
    """A :class:`Sink` of two callables (``dispatch=`` and ``reject=`` of :class:`Router`)."""

    def __init__(self, dispatch: Dispatch[Item], reject: Reject[Item]) -> None:
        self._dispatch = dispatch
        self._reject = reject

    def dispatch(self, item: Item, req: RouteRequest, target: int, decode_target: int) -> None:
        self._dispatch(item, req, target, decode_target)

    def reject(self, item: Item, req: RouteRequest, why: str) -> None:
        self._reject(item, req, why)


#: how every trace-driven backend writes a request the policy still holds when the trace is over (it
#: never left for a target): one status and one reason, so simulated and replayed rows compare row by row
HELD_AT_END = ("not_sent", "held by the router until the end of the run")


def _nothing_held(view: View) -> Released | None:
    return None


def detached(*_: object) -> NoReturn:
    """A run's callback once the run is over (:meth:`Router.detach`, ``TraceRun.detach``): a call fails."""
    raise RuntimeError("the run is over: its callbacks were detached")


def _own_hook(policy: Policy, name: str) -> Callable[..., Any] | None:
    """The policy's ``name`` hook, bound; None where it has none or only the protocol's default
    (which does nothing), so the Router skips a call per request that could change nothing.

    Typed ``Any``: the Router is compiled with the simulator's core (compiled_core.py), where a
    declared return type is checked at run time; what a user's policy returns is checked here, in
    the Router's own words, or passed on as it is (the pure-Python Router does the same)."""
    hook: Callable[..., Any] | None = getattr(policy, name, None)
    if hook is None or getattr(hook, "__func__", None) is getattr(Policy, name):
        return None
    return hook


def can_pair(policy: Policy) -> bool:
    """Whether the policy has its own ``choose_pair`` (the protocol's default only raises)."""
    own = getattr(type(policy), "choose_pair", None)
    return own is not None and own is not Policy.choose_pair


def observes_outcomes(policy: Policy) -> bool:
    """Whether the policy has its own ``on_complete`` (the protocol's default ignores outcomes)."""
    own = getattr(type(policy), "on_complete", None)
    return own is not None and own is not Policy.on_complete


class Router(Generic[Item]):
    """A policy in front of a backend; see the module docstring."""

    __slots__ = ("policy", "view", "held", "observes", "_attrs", "_ledger", "_pick", "_sink", "_on_release",
                 "_choose", "_release", "_on_complete", "_predict", "_name")

    def __init__(self, policy: Policy, view: View, *, dispatch: Dispatch[Item] | None = None,
                 reject: Reject[Item] | None = None, sink: Sink[Item] | None = None,
                 on_release: Callable[[Item, RouteRequest], None] | None = None,
                 disaggregated: bool = False) -> None:
        """The backend is told through ``sink``, or through the two callables ``dispatch`` and
        ``reject`` (one or the other). ``on_release(item, request)`` runs just before a held request is dispatched (the simulator
        gives it back its first arrival time). ``disaggregated``: the fleet has prefill and decode
        pools, so requests go through :meth:`route_pair`; a policy without ``choose_pair`` is refused."""
        if disaggregated and not can_pair(policy):
            raise PolicyError(f"policy {getattr(policy, 'name', policy)!r} cannot route a disaggregated "
                              f"cluster (it has no choose_pair); try pd_pair")
        self.policy = policy
        self.view = view
        #: the view's attributes, where the decision time is written (policies get the view read-only)
        self._attrs = view.__dict__
        #: the view's books as compiled code (policies/books.py): the accounting, and the lists a pick reads
        self._ledger = view_books(view).ledger
        #: a built-in policy's compiled decision, asked directly where the policy keeps its ``choose``
        #: (``base.Picked``): the same decision without an interpreted call
        self._pick: Pick | None = policy.pick if isinstance(policy, Picked) and type(policy).choose is Picked.choose else None
        #: request_id -> the backend's item, for requests the policy holds
        self.held: dict[int, Item] = {}
        if sink is None:
            if dispatch is None or reject is None:
                raise TypeError("Router needs a sink, or both dispatch and reject")
            sink = Callbacks(dispatch, reject)
        elif dispatch is not None or reject is not None:
            raise TypeError("Router takes a sink or the dispatch and reject callables, not both")
        self._sink: Sink[Item] = sink
        self._on_release = on_release
        # the hooks, bound once; a policy that only has ``choose`` gets the protocol's defaults, and
        # the defaults of on_complete and predicted_cached (no-ops) are not called at all
        self._choose: Callable[[RouteRequest, View], Any] = policy.choose
        self._release: Callable[[View], Any] = getattr(policy, "release", _nothing_held)
        self._on_complete = _own_hook(policy, "on_complete")
        self._predict = _own_hook(policy, "predicted_cached")
        self._name = getattr(policy, "name", "") or type(policy).__name__
        #: the policy has its own ``on_complete``: backends set ``RouteRequest.outcome`` before
        #: :meth:`complete` (measuring it costs a little per request; others skip it)
        self.observes = observes_outcomes(policy)

    # ---- decisions ------------------------------------------------------------------------------

    def route(self, item: Item, req: RouteRequest, now: float) -> Decision:
        """Ask the policy for ``req`` at time ``now`` and act on the answer; returns the decision."""
        view = self.view
        self._attrs["now"] = now
        pick = self._pick
        ledger = self._ledger
        d = pick.choose(ledger) if pick is not None else self._choose(req, view)
        if isinstance(d, int) and 0 <= d < len(ledger.targets):   # the view's list of targets, natively
            req.predicted_cached_tokens = self._predict(req, d, view) if self._predict is not None else None
            self._sink.dispatch(item, req, d, -1)
            return d
        if d is HOLD:
            self.held[req.request_id] = item
            self.drain()
        elif d is REJECT:
            self._sink.reject(item, req, f"rejected by the router ({self._name})")
        else:
            raise self._out_of_range(d)
        verdict: Verdict = d
        return verdict

    def route_pair(self, item: Item, req: RouteRequest, now: float) -> Decision:
        """:meth:`route` for a disaggregated fleet: ``choose_pair`` names a prefill and a decode target."""
        view = self.view
        self._attrs["now"] = now
        pair: Any = self.policy.choose_pair(req, view)   # Any: checked below, in the Router's words
        if pair is REJECT:
            self._sink.reject(item, req, "no healthy prefill or decode target")
            verdict: Verdict = pair
            return verdict
        p, d = pair
        self.check(p)
        self.check(d)
        req.predicted_cached_tokens = self._predict(req, p, view) if self._predict is not None else None
        self._sink.dispatch(item, req, p, d)
        prefill: int = p   # an int now: checked above
        return prefill

    def drain(self) -> None:
        """Dispatch (or reject) what the policy releases from its queue until it releases nothing."""
        held = self.held
        release = self._release
        while held:
            item_ = release(self.view)
            if item_ is None:
                return
            req, target = item_
            if target is not REJECT:
                self.check(target)    # before the pop: a refused release stays held, so it still gets its row
            item = held.pop(req.request_id)
            if target is REJECT:
                self._sink.reject(item, req, "dropped by the router queue")
                continue
            if self._on_release is not None:
                self._on_release(item, req)
            req.predicted_cached_tokens = self._predict(req, target, self.view) if self._predict is not None else None
            self._sink.dispatch(item, req, target, -1)

    def detach(self) -> None:
        """Drop the backend's callbacks (the run is over: ``TraceRun.detach``); a decision after this
        raises RuntimeError."""
        self._sink = Callbacks(detached, detached)
        self._on_release = None

    def take_held(self) -> list[Item]:
        """Empty the router queue (the run ended while the policy still held these); the caller writes them
        with :data:`HELD_AT_END`."""
        items = list(self.held.values())
        self.held.clear()
        return items

    def check(self, target: object) -> None:
        """Raise :class:`PolicyError` unless ``target`` indexes a target of the view."""
        if not (isinstance(target, int) and 0 <= target < len(self.view.targets)):
            raise self._out_of_range(target)

    def _out_of_range(self, target: object) -> PolicyError:
        n = len(self.view.targets)
        return PolicyError(f"policy {self._name!r} chose target {target!r}; there are {n} targets (0..{n - 1})")

    # ---- the view's own accounting --------------------------------------------------------------

    def sent(self, target: int, req: RouteRequest) -> None:
        """``req`` left for ``target`` (or, disaggregated, its next phase began there)."""
        self._ledger.sent(target, req.input_tokens + req.max_output_tokens)

    def left(self, target: int, req: RouteRequest) -> None:
        """``req`` ended at ``target`` but goes on elsewhere (a prefill handed over)."""
        self._ledger.ended(target, req.input_tokens + req.max_output_tokens)

    def complete(self, target: int, req: RouteRequest, drain: bool = True) -> None:
        """``req`` ended at ``target`` (any status): close the books, tell the policy, and (unless the
        caller drains later itself) release what the policy now lets go."""
        self._ledger.ended(target, req.input_tokens + req.max_output_tokens)
        if self._on_complete is not None:
            self._on_complete(req, target, self.view)
        if drain and self.held:
            self.drain()
