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
allocation, which matters at a million decisions per simulated run) through
this module's functions; the policy gets it read-only (:class:`View`: tuples). The
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
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, ClassVar, Collection, Final, Generic, Literal, NoReturn, Optional,
                    Protocol, Sequence, TypeVar, Union, overload)

from llmlb_bench.policies.books import Ledger, Pick
from llmlb_bench.policies.request import Outcome as Outcome, RouteRequest as RouteRequest  # re-exported

_T = TypeVar("_T")


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
class TargetInfo:
    """Static facts about a target (frozen: a policy reads them)."""

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


#: per-target fields the backend changes at most once per decision (a dispatch, an end, a health
#: change) and nearly every policy reads: rebuilt as tuples when written, read as plain attributes
_BOOKS: tuple[tuple[str, object], ...] = (("outstanding_requests", 0), ("healthy", True), ("adapters", None))
#: the scraped signals, which the simulator writes at every event of a replica when they are fresh,
#: and the token count, which few policies read: rebuilt at the first read after a change
_SIGNALS: tuple[tuple[str, object], ...] = (("outstanding_tokens", 0), ("waiting", 0), ("running", 0),
                                            ("kv_usage", 0.0), ("signal_time", 0.0))
_setattr = object.__setattr__


class Books:
    """The backend's side of a :class:`View`: one plain list per per-target field.

    Only the backend that owns the view holds these (:func:`view_books`). It changes them through
    this module's functions, except for the scraped signals in a hot loop: it may write
    ``waiting``, ``running``, ``kv_usage`` and ``signal_time`` directly and then call
    :meth:`changed` (one C call), so the next read by a policy sees them."""

    __slots__ = ("targets", *(name for name, _ in _BOOKS), *(name for name, _ in _SIGNALS), "snapshots", "changed",
                 "ledger")

    def __init__(self, fields: dict[str, list[object]], published: dict[str, object]) -> None:
        """``published``: the view's attributes, where the tuples of its books go."""
        for name, values in fields.items():
            _setattr(self, name, values)
        #: the signals' tuples as policies last read them (dropped by :meth:`changed`)
        #: (Any: each field's tuple has its own element type, which ``_Signal[T]`` reads back as
        #: ``tuple[T, ...]``; a cast there would cost a call on every read of a signal)
        self.snapshots: dict[str, tuple[Any, ...]] = {}
        #: the signal lists were written: forget their tuples
        self.changed: Callable[[], None] = self.snapshots.clear
        #: the same lists for compiled code: the own accounting and the built-in policies' picks
        self.ledger = Ledger(self.targets, self.outstanding_requests, self.outstanding_tokens, self.healthy,
                             self.waiting, self.running, published, self.snapshots)

    if TYPE_CHECKING:
        targets: list[TargetInfo]
        outstanding_requests: list[int]
        outstanding_tokens: list[int]
        healthy: list[bool]
        adapters: list[Optional[AdapterState]]
        waiting: list[int]
        running: list[int]
        kv_usage: list[float]
        signal_time: list[float]


class _Signal(Generic[_T]):
    """A scraped signal as a policy reads it: a tuple of the backend's list, built at the first read
    after a change (the simulator rewrites signals at every event, policies read them far less)."""

    __slots__ = ("name",)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, view: None, owner: type) -> _Signal[_T]: ...
    @overload
    def __get__(self, view: View, owner: type | None = None) -> tuple[_T, ...]: ...

    def __get__(self, view: View | None, owner: type | None = None) -> tuple[_T, ...] | _Signal[_T]:
        if view is None:
            return self
        books = view._books
        snap: tuple[_T, ...] | None = books.snapshots.get(self.name)
        if snap is None:
            snap = books.snapshots[self.name] = tuple(getattr(books, self.name))
        return snap

    def __set__(self, view: View, value: object) -> NoReturn:
        raise AttributeError(f"the View is read-only (tried to set {self.name!r})")


class View:
    """Live, per-target signals; index ``i`` refers to ``targets[i]``.

    Read-only by construction for the policies it is handed to: every per-target field reads as a
    tuple and assigning any attribute raises ``AttributeError``, so a policy that tries
    (``view.healthy[i] = False``, ``view.waiting.append(0)``, ``view.now = t``) fails instead of
    silently changing what the backend and other policies see. The backend owns the view and writes
    through this module's functions (:func:`put`, :func:`fill`, :func:`set_now`, :func:`add_target`,
    :func:`on_dispatch`, :func:`on_finish`) or, for the signals in a hot loop, the plain lists of
    :func:`view_books`.

    Why tuples: a tuple cannot be changed and indexes as fast as a list (a list subclass that
    refuses writes indexes several times slower in CPython 3.11, off the specialised path), and
    ``min`` / ``index`` run in C. The router's books, health and targets are rebuilt when written
    (once per dispatch or end) and read as plain instance attributes; the signals, rewritten at
    every simulator event, and the token count are rebuilt at the first read after a change. Given sequences are copied."""

    outstanding_tokens: _Signal[int] = _Signal()
    waiting: _Signal[int] = _Signal()
    running: _Signal[int] = _Signal()
    kv_usage: _Signal[float] = _Signal()
    signal_time: _Signal[float] = _Signal()
    if TYPE_CHECKING:
        targets: tuple[TargetInfo, ...]
        outstanding_requests: tuple[int, ...]
        healthy: tuple[bool, ...]
        #: each target's LoRA adapters (None: it publishes none, e.g. it serves no adapters)
        adapters: tuple[Optional[AdapterState], ...]
        now: float
        #: tokens per prefix-hash block of the trace (``schema.trace_block_size``)
        block_size: int
        #: exact cache state from KV events, where the backend publishes them:
        #: ``cached_prefix(i, prefix_hashes)`` = leading blocks target ``i`` holds now.
        #: ``None`` means no events; cache-aware policies then use their own approximate index.
        cached_prefix: Optional[Callable[[int, Sequence[int]], int]]
        _books: Books

    def __init__(self, targets: Sequence[TargetInfo], now: float = 0.0, outstanding_requests: Sequence[int] = (),
                 outstanding_tokens: Sequence[int] = (), waiting: Sequence[int] = (), running: Sequence[int] = (),
                 kv_usage: Sequence[float] = (), healthy: Sequence[bool] = (), signal_time: Sequence[float] = (),
                 block_size: int = 16, cached_prefix: Optional[Callable[[int, Sequence[int]], int]] = None,
                 adapters: Sequence[Optional[AdapterState]] = ()) -> None:
        n = len(targets)
        given: dict[str, Sequence[object]] = {
            "outstanding_requests": outstanding_requests, "outstanding_tokens": outstanding_tokens,
            "waiting": waiting, "running": running, "kv_usage": kv_usage, "healthy": healthy,
            "signal_time": signal_time, "adapters": adapters}
        fields: dict[str, list[object]] = {"targets": list(targets)}
        for name, zero in _BOOKS + _SIGNALS:
            fields[name] = list(given[name]) or [zero] * n
        # plain instance attributes (no __slots__): CPython's specialised attribute reads stay on
        self.__dict__.update(_books=Books(fields, self.__dict__), now=now, block_size=block_size, cached_prefix=cached_prefix)
        _publish(self, "targets", *(name for name, _ in _BOOKS))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"the View is read-only (tried to set {name!r}): a policy reads it, "
                             "the backend that owns it updates it")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"the View is read-only (tried to delete {name!r})")

    def __len__(self) -> int:
        return len(self._books.targets)

    def __repr__(self) -> str:
        return f"View(now={self.now}, targets={[t.name for t in self._books.targets]})"


# ---- the backend's side: the only writers of a View ---------------------------------------------

_SIGNAL_NAMES = frozenset(name for name, _ in _SIGNALS)


def _publish(view: View, *names: str) -> None:
    """Rebuild the tuples policies read for ``names`` (books, health, targets) from the lists."""
    snaps, books = view.__dict__, view._books
    for name in names:
        snaps[name] = tuple(getattr(books, name))


def view_books(view: View) -> Books:
    """The plain lists behind ``view``, for a backend's hot loop (see :class:`Books`)."""
    return view._books


def set_now(view: View, now: float) -> None:
    """The time of the decision about to be asked (the backend's clock)."""
    view.__dict__["now"] = now


def put(view: View, name: str, i: int, value: object) -> None:
    """Set target ``i``'s value of the per-target field ``name`` (a scrape, a health change)."""
    getattr(view._books, name)[i] = value
    _changed(view, name)


def fill(view: View, name: str, values: Sequence[object]) -> None:
    """Replace every target's value of the per-target field ``name`` (one value per target)."""
    current = getattr(view._books, name)
    if len(values) != len(current):
        raise ValueError(f"{name}: {len(values)} values for {len(current)} targets")
    current[:] = values
    _changed(view, name)


def _changed(view: View, name: str) -> None:
    if name in _SIGNAL_NAMES:
        view._books.snapshots.pop(name, None)
    else:
        _publish(view, name)


def set_cached_prefix(view: View, fn: Optional[Callable[[int, Sequence[int]], int]]) -> None:
    """Where exact prefix-cache state comes from (``View.cached_prefix``), or None for none."""
    view.__dict__["cached_prefix"] = fn


def add_target(view: View, info: TargetInfo, *, healthy: bool = True, now: float = 0.0,
               adapters: Optional[AdapterState] = None) -> None:
    """Append a target (a replica the autoscaler started): zero books, signals read at ``now``."""
    books = view._books
    books.targets.append(info)
    start = {"healthy": healthy, "signal_time": now, "adapters": adapters}
    for name, zero in _BOOKS + _SIGNALS:
        getattr(books, name).append(start.get(name, zero))
    books.changed()
    _publish(view, "targets", *(name for name, _ in _BOOKS))


def on_dispatch(view: View, i: int, req: RouteRequest) -> None:
    """Own accounting when a request is sent to target ``i`` (compiled: :meth:`Ledger.sent`)."""
    view._books.ledger.sent(i, req.input_tokens + req.max_output_tokens)


def on_finish(view: View, i: int, req: RouteRequest) -> None:
    """Own accounting when a request sent to target ``i`` ends, any status (compiled: :meth:`Ledger.ended`)."""
    view._books.ledger.ended(i, req.input_tokens + req.max_output_tokens)


class Policy(Protocol):
    """A routing policy: every hook a backend's :class:`~llmlb_bench.policies.router.Router` calls.

    Built-in policies subclass it and inherit the defaults (no completion hook,
    an empty router queue, no ``choose_pair``); a user's class may also just
    have the same methods (structural typing). Only ``choose`` is required.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: parameter name -> (default, one-line meaning); used by ``llmlb policies``
    params: ClassVar[dict[str, tuple[object, str]]] = {}

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

    def describe(self) -> dict[str, object]:
        return {"name": self.name, **{k: getattr(self, k, d) for k, (d, _) in self.params.items()}}


class Picked(Policy):
    """A built-in policy whose decision is a compiled :class:`~llmlb_bench.policies.books.Pick` over the
    view's books (``pick``, holding the policy's state): ``choose`` asks it, and a
    :class:`~llmlb_bench.policies.router.Router` whose policy keeps this ``choose`` (a subclass may
    override it) asks the pick itself, without an interpreted call per request."""

    pick: Pick

    def choose(self, req: RouteRequest, view: View) -> Decision:
        return self.pick.choose(view._books.ledger)
