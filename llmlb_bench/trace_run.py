"""A trace run's life cycle around the one Router, shared by the simulator and the replayer.

Both trace-driven backends do the same things with a request and differ only in
their clock (simulated events or real time) and in what "send" means (a replica's
queue or an HTTP request). What they share lives here once:

* :meth:`TraceRun.arrive`: a row reaches the router (its :class:`~llmlb_bench.policies.RouteRequest`
  built from the trace columns) and the policy decides;
* launched: the router's decision to send is booked (``Router.sent``) before the backend's
  :meth:`Backend.launch` runs, so no backend books it itself; on a
  disaggregated fleet (the simulator's: the replayer routes to endpoints, never to a pair) the
  decode leg too, at the hand-over (:meth:`TraceRun.handed_over`);
* :meth:`TraceRun.ended` (any status): the view's books and the policy's ``on_complete``, the
  rows that waited for this one released through the :class:`~llmlb_bench.trace_schedule.TraceSchedule`
  (the backend's :meth:`Backend.arrive_at` puts each on its clock), then the router queue drained;
  a request the router refused is written and releases its dependents the same way;
* :meth:`TraceRun.close`: every request the policy still holds is written
  :data:`~llmlb_bench.policies.router.HELD_AT_END` (``not_sent``), in both backends, and every row
  never released (what it waited for was never sent) ``not_sent`` too, so each trace row has one row;
* :meth:`TraceRun.detach`: the run's rows are written: the backend and the router's callbacks are
  dropped, so the run's objects are freed as soon as the backend lets go of them.

The backend writes its own rows of requests that reached a target (it alone knows their tokens and
times) and calls :meth:`ended` after; rows without a target go through its :meth:`Backend.write`.
``llmlb serve`` and ``llmlb route`` have no trace and keep the bare Router.
"""

from __future__ import annotations

from typing import Callable, NoReturn

from mypy_extensions import mypyc_attr

from llmlb_bench.policies import Policy, PolicyError, RouteRequest, Router, View
from llmlb_bench.policies.router import HELD_AT_END, Sink, detached
from llmlb_bench.trace_columns import TraceColumns
from llmlb_bench.trace_schedule import TraceSchedule


@mypyc_attr(allow_interpreted_subclasses=True)
class Backend:
    """What a trace-driven backend does for its :class:`TraceRun`: the simulator and the replayer
    subclass it. A base class rather than four callables because the compiled core
    (compiled_core.py) calls a method of a compiled subclass (the simulator) natively, where a bound
    method kept as a callable is an interpreted call per request (5% of a 19k-request simulation,
    measured); the replayer, interpreted, overrides the same methods."""

    def launch(self, row: int, route: RouteRequest, target: int, decode_target: int) -> None:
        """Send the request (``decode_target`` >= 0 only disaggregated); the books already say so."""
        raise NotImplementedError

    def write(self, row: int, target: str | None, status: str, error: str | None) -> None:
        """Write the row of a request that produced no tokens."""
        raise NotImplementedError

    def arrive_at(self, row: int, due: float) -> None:
        """The row was released; it reaches the router at ``due`` (the backend's clock)."""
        raise NotImplementedError

    def clock(self) -> float:
        """The backend's time now (simulated event time, or seconds since the replay's origin)."""
        raise NotImplementedError


class Detached(Backend):
    """The backend of a run that is over (:meth:`TraceRun.detach`): a call fails."""

    def launch(self, row: int, route: RouteRequest, target: int, decode_target: int) -> NoReturn:
        detached()

    def write(self, row: int, target: str | None, status: str, error: str | None) -> NoReturn:
        detached()

    def arrive_at(self, row: int, due: float) -> NoReturn:
        detached()

    def clock(self) -> NoReturn:
        detached()

#: how a row is written that never reached the router because a request it waits for never ended
#: (held by the policy until the end, or a closed-loop user's request that was never sent)
NOT_RELEASED = ("not_sent", "waits for a request that was never sent")


class TraceRun(Sink[int]):
    """One run of a trace through a policy; see the module docstring. The Router's :class:`Sink`
    (its ``dispatch`` books the send and launches, its ``reject`` writes the row), so that the
    compiled Router calls it natively."""

    __slots__ = ("router", "view", "tr", "schedule", "draining", "_pairs", "_backend", "_on_policy_error")

    def __init__(self, policy: Policy, view: View, tr: TraceColumns, schedule: TraceSchedule, backend: Backend, *,
                 on_release: Callable[[int, RouteRequest], None] | None = None,
                 disaggregated: bool = False, on_policy_error: Callable[[PolicyError], None] | None = None) -> None:
        """``on_release``: see :class:`~llmlb_bench.policies.Router`. ``on_policy_error``: a policy that
        breaks its contract while the queue drains after an end is handed to it (the replayer stops
        from there) instead of raised into the backend's callback."""
        self.router: Router[int] = Router(policy, view, sink=self, on_release=on_release, disaggregated=disaggregated)
        self.view = view
        self.tr = tr
        self.schedule = schedule
        #: False once the run is stopping: ends no longer drain the router queue
        self.draining = True
        #: requests go through ``Router.route_pair`` (a disaggregated fleet). The Router's methods are
        #: called directly, not kept as bound methods: compiled (compiled_core.py), a direct call stays native
        self._pairs = disaggregated
        self._backend = backend
        self._on_policy_error = on_policy_error

    def arrive(self, row: int, arrival_s: float, now: float) -> None:
        """Row ``row`` reaches the router at ``now``; ``arrival_s`` is what the policy sees as its arrival
        (the scheduled time; a retry's is when it came back)."""
        self.schedule.taken[row] = True
        if self._pairs:
            self.router.route_pair(row, self.tr.route_request(row, arrival_s), now)
        else:
            self.router.route(row, self.tr.route_request(row, arrival_s), now)

    def dispatch(self, row: int, route: RouteRequest, target: int, decode_target: int) -> None:
        self.router.sent(target, route)
        self._backend.launch(row, route, target, decode_target)

    def reject(self, row: int, route: RouteRequest, why: str) -> None:
        self._backend.write(row, None, "rejected", why)
        self.released(row, self._backend.clock())   # now: at a routing decision, or a queue drop on a later event

    def ended(self, row: int, target: int, route: RouteRequest, t: float, drain: bool = True) -> None:
        """``row`` ended at ``target`` at ``t`` (any status; its row written or buffered by the backend,
        ``route.outcome`` set where the router observes): close the books, release what waited for it,
        and (``drain``) hand out what the policy now lets go."""
        self.router.complete(target, route, False)
        self.released(row, t, drain)

    def handed_over(self, prefill: int, decode: int, route: RouteRequest) -> None:
        """A disaggregated request's prefill ended at ``prefill`` and its decode leg begins at ``decode``
        (its KV cache on the way): the books move it from one to the other, without ``on_complete`` (it
        has not ended). Booked here as the prefill leg was at launch, so no backend books ``sent`` itself;
        the decode leg then ends through :meth:`ended` or :meth:`complete` at ``decode``."""
        self.router.left(prefill, route)
        self.router.sent(decode, route)

    def complete(self, target: int, route: RouteRequest) -> None:
        """``route`` left ``target`` without ending (lost with a replica, about to be sent again)."""
        self.router.complete(target, route, False)

    def released(self, row: int, t: float, drain: bool = True) -> None:
        """``row`` ended at ``t`` without a target's books to close: release what waited for it, then drain."""
        schedule = self.schedule
        if schedule.dependent:
            due = schedule.due
            for c in schedule.ended(row, t):
                self._backend.arrive_at(c, due[c])
        if drain and self.router.held and self.draining:
            self.drain()

    def drain(self) -> None:
        """Hand out what the policy releases (after a replica came back, a scaling step ...)."""
        if self._on_policy_error is None:
            self.router.drain()
            return
        try:
            self.router.drain()
        except PolicyError as exc:
            self._on_policy_error(exc)

    def close(self, untaken_error: str | None = NOT_RELEASED[1]) -> None:
        """The run is over: write every request the policy still holds as :data:`HELD_AT_END`, in order
        of arrival (ties: request id), then every row never handed to the router (``untaken_error``:
        why; an interrupted run's unsent rows say nothing)."""
        due, rid, write = self.schedule.due, self.tr.rid, self._backend.write
        for _, _, row in sorted((due[r], rid[r], r) for r in self.router.take_held()):
            write(row, None, *HELD_AT_END)
        for row in self.schedule.untaken():
            write(row, None, "not_sent", untaken_error)

    def detach(self) -> None:
        """The run is over and its rows written: drop the backend and the router's callbacks, which
        hold the backend, this run and the router in reference cycles. Freed by reference counting,
        the run's objects (its trace-length lists among them) go when the backend drops them, where
        the cycles left them to the next collection of the collector's older generations: the
        simulator pauses the collector while it runs, so that collection came later, in whatever
        ran next (17-54 ms of a 100k-request run's report, traversing lists the run no longer needed).
        A backend method or callback called after this raises RuntimeError."""
        self.router.detach()
        self._backend = Detached()
        self._on_policy_error = None

