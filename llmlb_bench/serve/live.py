"""Simulated replicas advanced in real time: the engine behind ``llmlb serve``.

The batch simulator (:mod:`llmlb_bench.sim.simulation`) jumps from event to
event as fast as it can. Here the same replicas (:class:`~llmlb_bench.sim.replica.Replica`,
built by :class:`~llmlb_bench.sim.fleet.Fleet` from a
:class:`~llmlb_bench.sim.ClusterConfig`) follow a clock: simulated time is
``(perf_counter() - origin) x speed``. Nothing runs between events; the
replica is brought up to "now" when something happens:

* a request arrives: the replica is advanced to now (every run boundary up
  to now is applied), then the request is enqueued at now, exactly as the
  batch simulator enqueues a trace arrival (with a measured profile, after its
  request overhead, as there: see :mod:`llmlb_bench.sim.profile`);
* a timer fires at the next moment a token becomes final: the end of the
  next engine step while the replica holds streaming requests, otherwise
  its next run boundary (a finish, an admission, a preemption);
* a client disconnects: the request is aborted (:meth:`Replica.abort`).

Which tokens are final at time ``t``: a request's tokens are the end times
of a contiguous range of its replica's steps per admission (see
:mod:`llmlb_bench.sim.timeline`), so the tokens it has by ``t`` are its
closed step ranges plus the steps of its current range that ended by ``t``.
A step that ended by ``t`` can never be undone: a later arrival only cuts
the run in flight at the end of the step in progress. So a stream is
written one chunk per token at the simulated token times, and the token
times equal those of a batch simulation of the same arrivals.

Routing: with one port per replica each port feeds its own replica; with one
port in front of all of them a routing policy (the same objects as in the
simulator and the replayer) chooses through the same
:class:`~llmlb_bench.policies.Router` as the batch simulator (``HOLD`` and
``REJECT``, the target check, the view's own counts), with fresh
waiting/running/KV signals and exact prefix-cache contents.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from time import perf_counter
from typing import Callable, Protocol, Sequence

from llmlb_bench.errors import UserError
from llmlb_bench.policies import Decision, Outcome, Policy, PolicyError, RouteRequest, Router, View
from llmlb_bench.policies.base import view_books
from llmlb_bench.serve.metrics import LATENESS_BUCKETS, EngineMetrics, Histogram
from llmlb_bench.sim.config import ClusterConfig
from llmlb_bench.sim.fleet import Fleet
from llmlb_bench.sim.replica import Replica, Request
from llmlb_bench.sim.speculative import bundled_steps, step_tokens
from llmlb_bench.sim.timeline import Timeline

#: timeline runs a replica keeps before the ones no request needs are dropped
_TRIM_RUNS = 4096
#: float slack when deciding whether a step has ended by a time (steps are >= microseconds long)
_EPS = 1e-9


class Client(Protocol):
    """What the engine reports about one request (implemented by the HTTP layer)."""

    def on_start(self, live: "LiveRequest") -> None:
        """The request reached a replica (at once, or when a holding router released it)."""

    def on_tokens(self, live: "LiveRequest", count: int) -> None:
        """``count`` more tokens are final now (streaming requests only)."""

    def on_finish(self, live: "LiveRequest", count: int) -> None:
        """The request is done; its last ``count`` tokens were not reported yet."""

    def on_reject(self, live: "LiveRequest", message: str) -> None:
        """The router refused the request."""


@dataclass(frozen=True)
class Submission:
    """One request as the HTTP layer hands it over."""

    prompt_tokens: int
    output_tokens: int
    #: prefix-cache block hashes of the prompt (see :mod:`llmlb_bench.serve.tokenizer`)
    hashes: Sequence[int]
    stream: bool
    #: per-port mode: the replica; one-port mode: ``None`` (the policy chooses)
    target: int | None = None
    tenant: str = "default"
    priority: int = 0
    #: the requested ``max_tokens`` (what a router may know about the output)
    max_tokens: int = 0
    #: ``"stop"`` or ``"length"`` (see :mod:`llmlb_bench.serve.outputs`)
    finish_reason: str = "length"
    #: the LoRA adapter it names (None: the base model)
    adapter: str | None = None


class LiveRequest:
    """A request from arrival to its end."""

    __slots__ = ("seq", "sub", "client", "route", "req", "target", "arrival_s", "emitted", "done", "aborted",
                 "segments", "entering")

    def __init__(self, seq: int, sub: Submission, client: Client, arrival_s: float) -> None:
        self.seq = seq
        self.sub = sub
        self.client = client
        self.route: RouteRequest | None = None
        self.req: Request | None = None
        self.target = -1
        self.arrival_s = arrival_s
        #: tokens reported to the client so far (streaming)
        self.emitted = 0
        self.done = False
        self.aborted = False
        #: dispatched, still in the replica's API server (a profile's request overhead)
        self.entering = False
        #: once done: the simulated token times as ``(first token time, gap, count)`` segments
        self.segments: list[tuple[float, float, int]] = []

    @property
    def first_token_s(self) -> float:
        return self.segments[0][0] if self.segments else -1.0

    @property
    def last_token_s(self) -> float:
        if not self.segments:
            return -1.0
        start, gap, count = self.segments[-1]
        return start + (count - 1) * gap

    @property
    def cached_tokens(self) -> int:
        return max(self.req.cached, 0) if self.req is not None else 0

    @property
    def preemptions(self) -> int:
        return self.req.preemptions if self.req is not None else 0


class _ReplicaState:
    """A replica and what the live engine keeps next to it."""

    __slots__ = ("rep", "live", "streams", "timer", "timer_at", "metrics")

    def __init__(self, rep: Replica, metrics: EngineMetrics) -> None:
        self.rep = rep
        self.live: dict[Request, LiveRequest] = {}      # every request on this replica
        self.streams: dict[Request, LiveRequest] = {}   # the streaming ones
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = -1.0
        self.metrics = metrics


class _PortPerReplica(Policy):
    """The router of per-port mode: each port feeds its own replica, so nothing is chosen;
    the :class:`Router` only keeps the view's books."""

    name = "port_per_replica"

    def choose(self, req: RouteRequest, view: View) -> Decision:
        raise PolicyError("per-port mode routes nothing: each port feeds its own replica")


def hash_block_size(cfg: ClusterConfig) -> int:
    """Tokens per prompt hash block: the smallest engine block size (the others must be multiples)."""
    return min(p.block_size for p in cfg.pools)


class LiveFleet:
    """The simulated fleet on a real clock; see the module docstring."""

    def __init__(self, cfg: ClusterConfig, *, speed: float = 1.0, policy: Policy | None = None, seed: int = 0,
                 clock: Callable[[], float] = perf_counter) -> None:
        if cfg.disaggregated or cfg.autoscale is not None or cfg.failures or cfg.mtbf_s is not None:
            raise UserError("llmlb serve runs mixed pools only (no disaggregation, autoscaling or failures)",
                            "cluster")
        if cfg.signal_refresh_s:
            raise UserError("llmlb serve's router reads fresh signals at every event (a router that scrapes "
                            "/metrics sees its own staleness); leave signal_refresh_s at 0", "cluster.signal_refresh_s")
        if not speed > 0:
            raise UserError(f"must be > 0, got {speed!r}", "--speed")
        self.cfg = cfg
        self.speed = speed
        self.policy = policy
        self.block_size = hash_block_size(cfg)
        self.fleet = Fleet(cfg, self.block_size, prefix_hashes=True, seed=seed)
        self.replicas = self.fleet.replicas
        self.view = self.fleet.view
        #: longest prompt + output any replica accepts, and the model length
        self.max_total = min(rep.max_total for rep in self.replicas)
        self.max_model_len = min(rep.context_limit for rep in self.replicas)
        self.states = [_ReplicaState(rep, EngineMetrics(self.max_model_len)) for rep in self.replicas]
        self.clock = clock
        self.origin = clock()
        self._now = 0.0
        self._seq = 0
        self.router: Router[LiveRequest] = Router(policy if policy is not None else _PortPerReplica(),  # type: ignore[abstract]  # pairs nothing
                                                  self.view,
                                                  dispatch=self._routed, reject=self._refused)
        #: requests the router refused
        self.rejected = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        #: per wake-up that wrote tokens: wall seconds from their due time to the end of its last write
        self.lateness = Histogram(LATENESS_BUCKETS)
        self._writes = 0
        #: called with every request that ends (finished or aborted)
        self.on_end: Callable[[LiveRequest], None] | None = None

    # ---- time ------------------------------------------------------------------------------------

    def now(self) -> float:
        """Simulated seconds since the start (never decreasing): the time of an event being applied,
        which later events (a request's end of overhead, :meth:`_enter`) are ordered after."""
        self._now = self.read_now()
        return self._now

    def read_now(self) -> float:
        """Simulated seconds since the start, for a read-out (``/metrics``): not an event, so nothing
        is ordered after it. It was one: a scrape between a request's arrival and its late overhead
        timer made the request enter at the scrape's time, and the served times carried the lateness."""
        return max(self._now, (self.clock() - self.origin) * self.speed)

    def wall(self, sim_t: float) -> float:
        """The clock reading at which simulated time ``sim_t`` happens."""
        return self.origin + sim_t / self.speed

    # ---- requests --------------------------------------------------------------------------------

    def submit(self, sub: Submission, client: Client, received: float | None = None) -> LiveRequest:
        """A request arrives: at clock reading ``received`` (when its last byte was read, so that parsing
        and tokenising cost no simulated time), else now; never before an event already applied.
        The client hears ``on_start`` (or ``on_reject``) possibly before this returns."""
        t = self.now() if received is None else max(self._now, (received - self.origin) * self.speed)
        self._now = t
        self._seq += 1
        live = LiveRequest(self._seq, sub, client, t)
        route = live.route = RouteRequest(self._seq, t, sub.prompt_tokens, sub.max_tokens or sub.output_tokens,
                                          sub.tenant, None, sub.priority, "default", sub.hashes, sub.adapter)
        if sub.target is not None:
            self._dispatch(live, sub.target, t)
        else:
            self.router.route(live, route, t)
        return live

    @property
    def held(self) -> dict[int, LiveRequest]:
        """Requests the policy holds in its router queue, by request id."""
        return self.router.held

    def cancel(self, live: LiveRequest) -> None:
        """The client went away: drop the request (a running one leaves at the end of the current step)."""
        if live.done or live.aborted:
            return
        live.aborted = True
        if live.req is None or live.entering:   # held by the router (dropped when released) or not
            return                              # yet in the engine (ends when it would enter)
        t = self.now()
        st = self.states[live.target]
        self._advance(st, t)
        if live.done:
            return
        if st.rep.abort(live.req, t):   # left the queue (or the swap space) at once
            self._ended(st, live.req, t)
        self._arm(st)

    def _routed(self, live: LiveRequest, route: RouteRequest, i: int, _decode: int) -> None:
        """The router chose replica ``i`` (at once, or on releasing the request from its queue)."""
        if live.aborted:              # held, and the client left: the policy counted it as sent, so
            live.done = True          # close its books at once
            self.router.sent(i, route)
            if self.router.observes:
                route.outcome = Outcome("error", None, self._now, 0)
            self.router.complete(i, route, drain=False)
            return
        self._dispatch(live, i, self._now)

    def _refused(self, live: LiveRequest, route: RouteRequest, message: str) -> None:
        if live.aborted:
            live.done = True
        else:
            self._reject(live, message)

    def _dispatch(self, live: LiveRequest, i: int, t: float) -> None:
        st = self.states[i]
        rep = st.rep
        self._advance(st, t)
        sub = live.sub
        assert live.route is not None
        self.router.sent(i, live.route)
        # made as the batch simulator makes it (Replica.admit): the prompt's cache hashes at the replica's
        # stride, and the profile's API-server time before the engine sees it
        req, delay = rep.admit(live.seq, live.route, sub.prompt_tokens, sub.output_tokens)
        live.req = req
        live.target = i
        st.live[req] = live
        if sub.stream:
            st.streams[req] = live
        live.client.on_start(live)
        if delay > 0:
            live.entering = True
            asyncio.get_running_loop().call_later(max(0.0, self.wall(t + delay) - self.clock()), self._enter,
                                                  st, live, t + delay)
            return
        rep.enqueue(req, t)
        self._signals(i, t)
        self._arm(st)

    def _enter(self, st: _ReplicaState, live: LiveRequest, due: float) -> None:
        """``live`` reaches its engine's queue at ``due``, however late its timer fired, unless an
        event after ``due`` was applied meanwhile (then at that event's time: never before it).

        It entered at the time the timer fired: on a loaded machine a late timer moved the request's
        simulated times by the machine's lateness (1 ms on a 27 ms time to first token of
        tests/test_calibrate_serve.py), so the served times were no longer the batch simulation's."""
        live.entering = False
        st.rep.entering -= 1
        t = self._now = max(self._now, due)
        assert live.req is not None
        if live.aborted:
            self._ended(st, live.req, t)
            return
        self._advance(st, t)
        st.rep.enqueue(live.req, t)
        self._signals(st.rep.index, t)
        self._arm(st)

    def _reject(self, live: LiveRequest, message: str) -> None:
        live.done = True
        self.rejected += 1
        live.client.on_reject(live, message)

    # ---- advancing a replica ------------------------------------------------------------------------

    def _advance(self, st: _ReplicaState, t: float) -> None:
        """Apply every run boundary of the replica up to ``t``."""
        rep = st.rep
        while not rep.idle and rep.run_end <= t:
            bt = rep.run_end
            done: list[Request] = []      # per call: ending a request may dispatch another (re-entry)
            rep.boundary(done)
            self._signals(rep.index, bt)
            for req in done:
                self._ended(st, req, bt)
        if len(rep.timeline) > _TRIM_RUNS:
            rep.timeline.drop_before(rep.oldest_needed_step())

    def _ended(self, st: _ReplicaState, req: Request, t: float) -> None:
        """``req`` left its replica at ``t``: finished, or aborted."""
        live = st.live.pop(req)
        st.streams.pop(req, None)
        live.done = True
        assert live.route is not None
        made = req.generated
        if self.router.observes:
            first = st.rep.timeline.step_end(req.spans[0][0]) if made and req.spans else None
            live.route.outcome = Outcome("error" if live.aborted else "ok", first, t, made,
                                         req.cached if req.cached >= 0 else None)
        self.router.complete(live.target, live.route, drain=False)
        if made:
            if st.rep.spec is None:
                live.segments = token_segments(st.rep.timeline, req.spans)  # type: ignore[arg-type]  # made: it ran steps
            else:       # speculative decoding: one delivery per verify step, its tokens bundled
                times, tokens = bundled_steps(st.rep.timeline.arrays(), req.stints or [], req.spans or [])
                live.segments = [(t, 0.0, c) for t, c in zip(times.tolist(), tokens.tolist())]
        if live.aborted:
            st.metrics.aborted += 1
        else:
            st.metrics.observe(live, made)
            live.client.on_finish(live, made - live.emitted)
            live.emitted = made
            self._writes += 1
        if self.on_end is not None:
            self.on_end(live)
        if self.router.held:
            self.router.drain()

    def _signals(self, i: int, t: float) -> None:
        rep = self.replicas[i]
        books = view_books(self.view)
        books.waiting[i] = len(rep.waiting)
        books.running[i] = len(rep.running)
        books.kv_usage[i] = rep.kv.used / rep.kv.total
        books.signal_time[i] = t
        books.changed()

    # ---- streaming -----------------------------------------------------------------------------------

    def _emit(self, st: _ReplicaState, t: float) -> None:
        """Report the tokens that became final by ``t`` to each streaming request of the replica."""
        if not st.streams:
            return
        last = last_step_by(st.rep.timeline, t)
        for req, live in st.streams.items():
            n = tokens_by(req, last)
            if n > live.emitted:
                live.client.on_tokens(live, n - live.emitted)
                live.emitted = n
                self._writes += 1

    def _arm(self, st: _ReplicaState) -> None:
        """Set the replica's timer to its next moment of interest (see the module docstring)."""
        rep = st.rep
        if rep.idle:
            if st.timer is not None:
                st.timer.cancel()
                st.timer = None
            return
        target = next_step_end(rep.timeline, self._now, rep.run_end) if st.streams else rep.run_end
        if st.timer is not None:
            # one already due stays: it has not fired yet (a late timer, an event at the same moment), and
            # the tokens it is for go out when it does; moved to the next step end, they waited for that
            if st.timer_at == target or st.timer_at <= self._now:
                return
            st.timer.cancel()
        st.timer_at = target
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        st.timer = self._loop.call_later(max(0.0, self.wall(target) - self.clock()), self._wake, st)

    def _wake(self, st: _ReplicaState) -> None:
        st.timer = None
        target = st.timer_at
        t = self.now()
        if t < target:                # woke a hair early (timer granularity): act as of the target
            t = self._now = target
        writes = self._writes
        self._advance(st, t)
        self._emit(st, t)
        if self._writes != writes:
            self.lateness.observe(self.clock() - self.wall(target))
        self._arm(st)

    def close(self) -> None:
        for st in self.states:
            if st.timer is not None:
                st.timer.cancel()
                st.timer = None

    # ---- read-outs --------------------------------------------------------------------------------------

    def in_flight_tokens(self, i: int, t: float) -> tuple[int, int]:
        """(prompt tokens of requests past their first token, tokens generated) of replica ``i``'s
        requests in flight at ``t`` (the live part of the token counters)."""
        st = self.states[i]
        last = last_step_by(st.rep.timeline, t)
        prompt = made = 0
        for req in st.live:
            n = tokens_by(req, last)
            if n:
                prompt += req.prompt
                made += n
        return prompt, made


def tokens_by(req: Request, last: int) -> int:
    """Tokens a request still on its replica has made by the end of step ``last``: its closed
    step ranges, and the steps of its current range up to ``last`` (one token each; under
    speculative decoding, what each verify step drew)."""
    ranges = list(req.spans or ())
    start = req.span_start
    if 0 <= start <= last:
        ranges.append((start, last))
    if req.stints is None:
        return sum(b - a + 1 for a, b in ranges)
    return sum(int(step_tokens(req.stints, a, b).sum()) for a, b in ranges)


def last_step_by(tl: Timeline, t: float) -> int:
    """Index of the last step that ended by ``t`` (-1: none) in a replica's timeline."""
    for k in range(len(tl) - 1, -1, -1):
        start, gap = tl.start[k], tl.gap[k]
        if start + gap <= t + _EPS:
            return tl.first[k] + min(tl.count[k], int((t - start) / gap + _EPS)) - 1
    return -1


def next_step_end(tl: Timeline, t: float, run_end: float) -> float:
    """End time of the first step that ends after ``t`` in the run in flight (or the applied
    mixed step just before it); ``run_end`` when there is none."""
    for k in range(max(len(tl) - 2, 0), len(tl)):
        start, gap, count = tl.start[k], tl.gap[k], int(tl.count[k])
        if start + count * gap > t + _EPS:
            k = int((t - start) / gap + _EPS) + 1
            return start + min(max(k, 1), count) * gap
    return run_end


def token_segments(tl: Timeline, spans: Sequence[tuple[int, int]]) -> list[tuple[float, float, int]]:
    """A finished request's token times as segments ``(first token time, gap, count)``, one per
    timeline run each of its step ranges overlaps (as the simulator's ``token_times``)."""
    segs: list[tuple[float, float, int]] = []
    for a, b in spans:
        k = tl.run_of(a)
        while a <= b:
            first, start, gap, count = int(tl.first[k]), tl.start[k], tl.gap[k], int(tl.count[k])
            hi = min(b, first + count - 1)
            segs.append((start + (a - first + 1) * gap, gap, hi - a + 1))
            a = hi + 1
            k += 1
    return segs
