"""The cluster simulation: arrivals, routing and replica events in one time-ordered loop.

Event sources, merged by time (ties in this order):

1. trace arrivals of independent requests, in arrival order;
2. a heap of timed deliveries, each carrying its own handler: dependent requests
   released by their parent's end, requests retried after a replica failure, KV
   caches arriving at a decode replica (disaggregation), replica failures and
   recoveries, slowdowns, autoscaling and clock decisions (a new kind of event is a
   new handler method, not a new branch of the loop);
3. replica run boundaries: at most one per replica (:class:`BoundaryHeap`; a moved boundary
   bumps the replica's ``version`` and leaves a stale entry until it is replaced or reaches the top);
4. series sampling ticks.

Work per event is O(log replicas) plus the policy's own cost, and the number
of events grows with requests and batch changes, not with tokens.

Routing goes through the shared :class:`~llmlb_bench.policies.View`: the
simulator keeps the router's own accounting (``on_dispatch`` / ``on_finish``;
per phase under disaggregation), refreshes each replica's waiting / running /
KV-usage signals at each of its boundaries and at each dispatch (so
``signal_time`` is always now) or, with ``signal_refresh_s`` > 0, only when a
scraper would read them (at multiples of the interval, all replicas at once,
as of that instant: routers then act on stale signals, as real ones do),
publishes exact prefix-cache contents through ``View.cached_prefix``. The
decisions themselves, the router queue (``HOLD`` / ``release``), ``REJECT``,
the target check and the view's books go through the one
:class:`~llmlb_bench.policies.Router`, as in ``llmlb serve`` and the replayer. Around it, the
:class:`~llmlb_bench.trace_run.TraceRun` the replayer uses too: arrivals, dependents and
closed-loop users (:mod:`llmlb_bench.trace_schedule`), ends, the queue drained, held rows at the
end; this module keeps the heaps, the replica events and the rows of what replicas served.
"""

from __future__ import annotations

import gc
import math
import time
from heapq import heappop, heappush
from typing import Any, Callable, cast

import numpy as np
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.policies import Outcome, Policy, RouteRequest
from llmlb_bench.policies.base import put, view_books
from llmlb_bench.run_summary import ExpertLoadSummary, LoraSummary, RunSummary, SwapSummary
from llmlb_bench.schema import TRACE, trace_block_size
from llmlb_bench.sim.autoscale import PoolStatus
from llmlb_bench.sim.green import ClockLog
from llmlb_bench.sim.indexed_heap import HeapEntry, IndexedHeap
from llmlb_bench.sim.config import ClusterConfig
from llmlb_bench.sim.fleet import Fleet
from llmlb_bench.sim.moe import ExpertLoad
from llmlb_bench.sim.replica import Replica, Request
from llmlb_bench.sim.results import RequestRecorder, RunSinks
from llmlb_bench.sim.series import SeriesSampler
from llmlb_bench.trace_columns import TraceColumns
from llmlb_bench.trace_run import Backend, TraceRun
from llmlb_bench.trace_schedule import TraceSchedule

#: a timed delivery's handler: ``handle(payload, now)`` (see :meth:`Simulation._deliver`)
Handler = Callable[[Any, float], None]
#: events between two collections of the youngest GC generation while automatic GC is paused
_GC_EVERY = 100_000


class _Unread:
    """Stands in for a View signal list between scrapes: writes to it are dropped."""

    __slots__ = ()

    def __setitem__(self, i: int, value: Any) -> None:
        return None


_UNREAD = _Unread()


def _nothing() -> None:
    """``changed()`` when signals are only scraped: the unread stand-ins changed nothing."""


class Boundary(HeapEntry):
    """One replica's pending run boundary: its time is the key, and the replica version it belongs
    to. One per replica, reused."""

    __slots__ = ("replica", "version")

    def __init__(self, replica: int) -> None:
        super().__init__()
        self.replica = replica
        self.version = 0


class BoundaryHeap(IndexedHeap):
    """The replicas' pending run boundaries, earliest first (ties: the order they were set in).

    A replica has at most one boundary that can still be valid, the one set last (each new one follows
    a ``version`` bump), so setting one moves the replica's entry in place instead of pushing a tuple
    next to the stale one (sim/indexed_heap.py). A boundary whose replica's version moved on since
    (the replica went idle, failed, or its run was cut) stays until it reaches the top."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        super().__init__()
        #: per replica index, its boundary
        self.entries: list[Boundary] = []

    def set(self, i: int, t: float, seq: int, version: int) -> None:
        """Replica ``i``'s next boundary is at ``t`` (replacing the one it had, if any)."""
        entries = self.entries
        while len(entries) <= i:          # a replica the autoscaler added
            entries.append(Boundary(len(entries)))
        b = entries[i]
        b.version = version
        self.place(b, t, seq)


class Simulation(Backend):
    """One simulated run; see :func:`simulate`."""

    def __init__(self, trace: pa.Table, cfg: ClusterConfig, policy: Policy, run: RunSinks, seed: int,
                 users: int | None = None, think_s: float = 0.0) -> None:
        self.cfg = cfg
        self.policy = policy
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        trace = TRACE.conform(trace, "trace")
        self.trace = trace
        self.n = trace.num_rows
        self.cols = cols = TraceColumns(trace)
        self.fleet = Fleet(cfg, trace_block_size(trace), cols.has_hashes, seed, trace)
        self.replicas = self.fleet.replicas
        self.view = self.fleet.view
        if users is not None and users < 1:
            raise UserError("must be at least 1", "--users")
        #: when each row reaches the router: roots, dependents, closed-loop users (trace_schedule.py)
        self.schedule = schedule = TraceSchedule(cols, users=users, think_s=think_s)
        self.rid, self.inp, self.out = cols.rid, cols.inp, cols.out
        # per row: when the request reached the router (after its parent, for dependents; the schedule's
        # time) and when it was first sent to a target (None: not yet); plain lists are fastest per item
        self.scheduled: list[float] = schedule.due
        self.sent: list[float | None] = [None] * self.n
        # the rows that arrive on their own, in order (closed loop: one per user; the rest follow ends)
        self.order = schedule.roots[:schedule.initial]
        self.recorder = RequestRecorder(trace, run.requests, self.replicas, self.scheduled, self.sent,
                                        cfg.token_times)
        self.sampler = SeriesSampler(run.series, self.replicas, cfg.series_interval_s)
        self.fleet.on_add += [self.recorder.track, self.sampler.track]
        #: the run around the Router: arrive -> launched -> ended -> dependents released -> drain; close
        self.core = TraceRun(policy, self.view, cols, schedule, self, on_release=self._released,
                             disaggregated=cfg.disaggregated)
        self.router = self.core.router
        self.boundaries = BoundaryHeap()
        self.deliveries: list[tuple[float, int, Handler, Any, bool]] = []
        self._seq = 0                    # tie-breaker of equal times: insertion order (the last one given)
        self._work = 0                   # pending deliveries other than life-cycle events
        self._k = 0                      # independent arrivals routed so far
        self._now = 0.0                  # the time of the event being handled
        self.events = 0
        self.retries = 0
        # scraped signals: written at every event when fresh; else only by _scrape, every signal_refresh_s
        self._refresh = cfg.signal_refresh_s
        books = view_books(self.view)
        self._sig: tuple[Any, Any, Any, Any] = ((books.waiting, books.running, books.kv_usage, books.signal_time)
                                                if self._refresh == 0 else (_UNREAD,) * 4)
        #: after writing signals into the view's lists: the policies' next read sees them
        self._changed = books.changed if self._refresh == 0 else _nothing
        self._schedule_failures()
        self.autoscale = cfg.autoscale_spec
        if self.autoscale is not None:
            self.autoscaler = self.autoscale.make()
            self._deliver(self.autoscale.interval_s, self._scale, None)
        self.green = cfg.green_spec                          # clock control (sim/green.py)
        if self.green is not None:
            self.green_ctl = self.green.make()
            self.clock_log = ClockLog(self.fleet.clocks())
            self._deliver(self.green.interval_s, self._green_tick, None)
        self.expert_loads = self.fleet.expert_loads()      # MoE pools with skewed experts (cluster.moe)
        for load in self.expert_loads.values():
            if load.next_change < math.inf:
                self._deliver(load.next_change, self._experts, load)

    # ---- setup ------------------------------------------------------------------------------------

    def _schedule_failures(self) -> None:
        cfg = self.cfg
        for f in cfg.failures:
            i = int(f["target"][1:])
            self._deliver(float(f["at_s"]), self._fail, (i, float(f.get("down_s", cfg.mttr_s))))
        for f in cfg.slowdowns:
            i = int(f["target"][1:])
            self._deliver(float(f["at_s"]), self._slow, (i, float(f["factor"])))
            if "for_s" in f:
                self._deliver(float(f["at_s"]) + float(f["for_s"]), self._slow, (i, 1.0))
        if cfg.mtbf_s is not None:
            for i in range(len(self.replicas)):
                self._deliver(float(self.rng.exponential(cfg.mtbf_s)), self._fail, (i, -1.0))

    # ---- the loop -----------------------------------------------------------------------------------

    def _deliver(self, t: float, handle: Handler, payload: Any, work: bool = False) -> None:
        """At ``t``, call ``handle(payload, t)``. ``work``: the delivery carries a request (an arrival, a
        KV transfer, an API server's hand-over), so the run is not over while it is pending; life-cycle
        events (failures, scaling, clock decisions ...) do not keep an idle, finished cluster running.
        A new kind of event is a new handler method, not a new branch of the loop."""
        if work:
            self._work += 1
        self._seq += 1
        heappush(self.deliveries, (t, self._seq, handle, payload, work))

    def _push(self, rep: Replica, t: float | None) -> None:
        if t is not None:
            self._seq += 1
            self.boundaries.set(rep.index, t, self._seq, rep.version)

    def run(self) -> float:
        replicas, boundaries, deliveries = self.replicas, self.boundaries, self.deliveries
        order, sampler = self.order, self.sampler
        arrival = self.scheduled
        due = [arrival[r] for r in order]            # arrival times in routing order: one index per event
        v_waiting, v_running, v_kv, v_time = self._sig
        changed = self._changed
        inf = math.inf
        next_scrape = 0.0 if self._refresh > 0 else inf
        next_sample = sampler.next_t
        n_order = len(order)
        k = 0
        events = 0
        done: list[Request] = []
        now = 0.0
        while True:
            tb = inf
            while boundaries.heap:
                first = cast(Boundary, boundaries.heap[0])
                if first.version == replicas[first.replica].version:
                    tb = first.key
                    break
                boundaries.pop()       # stale: its replica's boundary moved or went
            ta = due[k] if k < n_order else inf
            td = deliveries[0][0] if deliveries else inf
            if ta == inf and tb == inf and not self._work:
                break                    # only failures of an idle, finished cluster remain
            now = self._now = ta if ta <= td and ta <= tb else (td if td <= tb else tb)
            if now >= next_sample:
                sampler.sample_until(now)
                next_sample = sampler.next_t
            if now >= next_scrape:
                next_scrape = self._scrape(now)
            events += 1
            if not events % _GC_EVERY:
                gc.collect(0)
            if ta == now:
                row = order[k]
                k += 1
                self._k = k
                self._route(row, now)
            elif td == now:
                _, _, handle, payload, work = heappop(deliveries)
                if work:
                    self._work -= 1
                handle(payload, now)
            else:
                i = cast(Boundary, boundaries.pop()).replica
                rep = replicas[i]
                nt = rep.boundary(done)
                if nt is not None:
                    self._seq += 1
                    boundaries.set(i, nt, self._seq, rep.version)
                elif rep.draining and not rep.waiting and not rep.entering:
                    rep.retire(now)
                if done:
                    for req in done:
                        self._done(req, now)
                    done.clear()
                v_waiting[i] = len(rep.waiting)
                v_running[i] = len(rep.running)
                v_kv[i] = rep.kv.used / rep.kv.total
                v_time[i] = now
                changed()
        self.events = events
        end = max([now] + [r.t for r in replicas])
        self.core.close()
        return float(end)

    # ---- routing ------------------------------------------------------------------------------------

    def _route(self, row: int, t: float) -> None:
        """A request reaches the router at ``t`` (first time, after its parent, or as a retry)."""
        self.core.arrive(row, t, t)

    def arrive_at(self, row: int, due: float) -> None:
        """A dependent (or a closed-loop user's next request) was released: it arrives at ``due``."""
        self._deliver(due, self._route, row, work=True)

    def _released(self, row: int, route: RouteRequest) -> None:
        route.arrival_s = self.scheduled[row]   # a held retry is released with its first arrival

    def write(self, row: int, target: str | None, status: str, error: str | None) -> None:
        """The row of a request that produced no tokens (refused, held at the end, never released)."""
        self.recorder.ended(row, target, status, error)

    def launch(self, row: int, route: RouteRequest, i: int, decode_target: int) -> None:
        """The router sent row ``row`` to replica ``i`` (and, disaggregated, its decode to ``decode_target``)."""
        t = self._now
        if self.sent[row] is None:
            self.sent[row] = t
        rep = self.replicas[i]
        view = self.view
        prompt, output = self.inp[row], self.out[row]
        # the common case inline (one call less per request); _admission_error says why not
        error = None if (1 <= prompt and 1 <= output and prompt + output <= rep.max_total
                         and (route.adapter is None or rep.lora is not None)) else self._admission_error(row, i)
        if error is None and not view.healthy[i]:
            error = f"target {rep.name} is " + ("down" if rep.down else "not in service (starting or removed)")
        if error is None and decode_target >= 0 and not self.replicas[decode_target].fits(
                self.inp[row] + self.out[row] - 1):
            error = f"needs more KV blocks than decode target {self.replicas[decode_target].name} has"
        if error is not None:
            status = "rejected" if view.healthy[i] else "error"
            if self.router.observes:
                route.outcome = Outcome(status, None, t, 0)
            self.recorder.ended(row, rep.name, status, error)
            self.core.ended(row, i, route, t)
            return
        req, delay = rep.admit(row, route, prompt, output)   # as llmlb serve's replicas (serve/live.py)
        if decode_target >= 0:
            req.stop = 1
            req.prefill_target = i
            req.decode_target = decode_target
        if delay > 0:       # a measured profile's API-server time (sim/profile.py): the engine sees it later
            self._deliver(t + delay, self._reach_engine, req, work=True)
            return
        self._push(rep, rep.enqueue(req, t))
        self._signals(rep, t)

    def _admission_error(self, row: int, i: int) -> str | None:
        """Why a request can never be served by replica ``i`` (vLLM rejects these up front), or None."""
        prompt, output = self.inp[row], self.out[row]
        rep = self.replicas[i]
        adapter = self.cols.adapter[row]
        if adapter is not None and rep.lora is None:
            return f"the model {adapter!r} does not exist: {rep.name} serves no LoRA adapters (max_loras = 0)"
        if prompt >= 1 and output >= 1 and prompt + output <= rep.max_total:
            return None
        if prompt < 1 or output < 1:
            return f"input_tokens ({prompt}) and output_tokens ({output}) must both be >= 1"
        total = prompt + output
        limit = rep.context_limit
        if total > limit:
            return f"input + output = {total} tokens exceeds the maximum model length {limit}"
        if not rep.fits(total - 1):
            return f"needs {-(-(total - 1) // rep.bs)} KV blocks, more than the replica's {rep.kv.total}"
        if not rep.chunked and total - 1 > rep.budget:
            return (f"{total - 1} tokens to prefill exceed max_num_batched_tokens {rep.budget} "
                    f"with chunked prefill off")
        return None

    # ---- completions ------------------------------------------------------------------------------------

    def _done(self, req: Request, t: float) -> None:
        router = self.router
        if req.stop < req.out:
            self.core.handed_over(req.target, req.decode_target, req.route)
            self._hand_over(req, t)
            return
        if router.observes:
            req.route.outcome = self._outcome(req, t)
        if self.green is not None:
            self._green_observe(req, t)
        self.recorder.finished(req)
        if req.hashes is not None and self.schedule.dependent:
            self._cache_reply(req)
        self.core.ended(req.row, req.target, req.route, t)

    def _outcome(self, req: Request, t: float) -> Outcome:
        """What a finished request delivered, for a policy that observes outcomes (the same first-token
        time the results row gets: the end of its first step here, or the prefill replica's token)."""
        first = req.first_token_s if req.first_token_s >= 0 else \
            self.replicas[req.target].timeline.step_end(req.spans[0][0]) if req.spans else t
        return Outcome("ok", first, t, req.out, req.cached if req.cached >= 0 else None)

    def _hand_over(self, req: Request, t: float) -> None:
        """Prefill done on a prefill replica: ship the KV cache to the decode replica."""
        cfg = self.cfg
        p, d = req.target, req.decode_target    # the books moved it already (TraceRun.handed_over)
        prefill = self.replicas[p]
        nbytes = req.prompt * prefill.cost.model.kv_bytes_per_token
        prefill.link_free_at = max(t, prefill.link_free_at) + nbytes / (cfg.kv_link_gb_s * 1e9)
        req.first_token_s = t
        req.target = d
        req.spans = None
        req.span_start = -1
        req.hashes = None
        req.shared = 0
        req.computed = req.prompt         # the KV arrives with the request
        req.stop = req.out
        self._deliver(prefill.link_free_at + cfg.kv_link_latency_ms / 1000.0, self._kv_arrive, req, work=True)

    def _reach_engine(self, req: Request, t: float) -> None:
        """A request dispatched to ``req.target`` reaches its engine's queue after the profile's
        request overhead (lost if the replica failed meanwhile)."""
        rep = self.replicas[req.target]
        rep.entering -= 1
        if rep.down:
            self._lose(req, t, f"replica {rep.name} failed")
            return
        self._push(rep, rep.enqueue(req, t))
        self._signals(rep, t)

    def _kv_arrive(self, req: Request, t: float) -> None:
        rep = self.replicas[req.decode_target]
        if not self.view.healthy[rep.index]:
            self._lose(req, t, f"decode target {rep.name} is down")
            return
        self._push(rep, rep.enqueue(req, t))
        self._signals(rep, t)

    def _cache_reply(self, req: Request) -> None:
        """Keep the KV of a finished turn's reply in its replica's prefix cache.

        The engine caches every full block it computed, the reply's included, but the
        trace names only prompt blocks. The next turn of the same conversation (a child
        whose prompt starts with this prompt's full blocks) names them: its hashes that
        lie within this request's prompt + reply cover exactly the reply's KV. A reply that opens
        with reasoning leaves nothing a next turn shares: the conversation's history keeps the
        answer, not the reasoning before it (workload/reasoning.py), so its prompt parts from this
        KV right after this prompt."""
        if self.cols.reasoning[req.row]:
            return
        rep = self.replicas[req.target]
        cache, own_hashes = rep.kv.cache, req.hashes
        assert cache is not None and own_hashes is not None   # called for hashed requests, which need a cache
        unit = rep.bs * cache.unit_blocks
        own = req.prompt // unit
        upto = (req.prompt + req.out - 1) // unit
        if upto <= own:
            return
        stride = rep.hash_stride
        for child in self.schedule.children(req.row):
            hashes = self.cols.hashes(child)
            if stride > 1:
                hashes = hashes[stride - 1::stride]
            if len(hashes) >= upto and hashes[:own] == own_hashes[:own]:
                cache.add_free(hashes, own, upto)
                cache.evict_to(rep.kv.total - rep.kv.used)
                return

    def _signals(self, rep: Replica, t: float) -> None:
        i = rep.index
        s_waiting, s_running, s_kv, s_time = self._sig
        s_waiting[i] = len(rep.waiting)
        s_running[i] = len(rep.running)
        s_kv[i] = rep.kv.used / rep.kv.total
        s_time[i] = t
        self._changed()

    def _scrape(self, now: float) -> float:
        """Scrape every replica's signals as of the last refresh tick at or before ``now``.

        Called before the first event at or after the tick, so the replicas are still
        in their state at the tick (KV use is exact inside a decode run). Returns the
        next tick."""
        k = math.floor(now / self._refresh)
        tick = k * self._refresh
        books = view_books(self.view)
        for rep in self.replicas:
            i = rep.index
            books.waiting[i] = len(rep.waiting)
            books.running[i] = len(rep.running)
            books.kv_usage[i] = rep.blocks_used_at(tick) / rep.kv.total
            if rep.lora is not None:     # a book, not a signal: put() publishes the view's tuple again
                put(self.view, "adapters", i, rep.lora.snapshot())
            books.signal_time[i] = tick
        books.changed()
        return (k + 1) * self._refresh

    # ---- replica life cycle -----------------------------------------------------------------------------

    def _fail(self, payload: tuple[int, float], t: float) -> None:
        i, down = payload
        rep = self.replicas[i]
        if rep.down or rep.retired_at is not None:
            return
        rep.down = True
        self.fleet.refresh_health(rep)
        rep.failures += 1
        for req in rep.drain(t):
            self._lose(req, t, f"replica {rep.name} failed")
        self._signals(rep, t)
        if down < 0:
            down = float(self.rng.exponential(self.cfg.mttr_s))
        self._deliver(t + down, self._recover, i)

    def _lose(self, req: Request, t: float, error: str) -> None:
        """A request lost with its replica: retried through the router, or reported as an error."""
        if self.router.observes:
            req.route.outcome = Outcome("error", None, t, req.generated)
        if self.cfg.on_failure == "retry":
            self.core.complete(req.target, req.route)
            self.retries += 1
            self._deliver(t, self._route, req.row, work=True)
            return
        self.recorder.ended(req.row, self.replicas[req.target].name, "error", error)
        # no drain here (as ever): held requests go at the next completion, recovery or scaling step
        self.core.ended(req.row, req.target, req.route, t, drain=False)

    def _recover(self, i: int, t: float) -> None:
        rep = self.replicas[i]
        rep.down = False
        rep.idle_since = rep.t = t           # a failed replica draws no power while down
        self.fleet.refresh_health(rep)
        self._signals(rep, t)
        if self.cfg.mtbf_s is not None and rep.retired_at is None:
            self._deliver(t + float(self.rng.exponential(self.cfg.mtbf_s)), self._fail, (i, -1.0))
        self.core.drain()

    def _scale(self, _: None, t: float) -> None:
        """An autoscaling decision: grow or shrink pools toward the autoscaler's sizes."""
        spec = self.autoscale
        assert spec is not None     # scheduled only with an autoscale spec
        status = self.fleet.status()
        for name, want in self.autoscaler.decide(t, self.view, status).items():
            if name not in status:
                raise UserError(f"autoscaler asked for unknown pool {name!r} (pools: {', '.join(status)})",
                                "cluster.autoscale")
            st = status[name]
            change = int(want) - st.size
            for i in st.draining[::-1][:max(change, 0)]:       # grow: cancel removals first ...
                self.replicas[i].draining = False
                self.fleet.refresh_health(self.replicas[i])
                change -= 1
            for _k in range(max(change, 0)):                  # ... then add replicas
                rep = self.fleet.add(name, t, starting=spec.cold_start_s > 0)
                if rep.starting:
                    self._deliver(t + spec.cold_start_s, self._ready, rep.index)
            if change < 0:
                self._shrink(st, -change, t)
        if self.events_pending():
            self._deliver(t + spec.interval_s, self._scale, None)
        self.core.drain()

    def _green_observe(self, req: Request, t: float) -> None:
        """Feed the green controller a finished request's TTFT (from reaching the router) and TPOT:
        both to the pool that served it or, disaggregated, the TTFT to its prefill pool and the
        TPOT to its decode pool (each phase's clock answers for its own latency, as VoltanaLLM's)."""
        first = (req.route.outcome if self.router.observes else self._outcome(req, t)).first_token_s
        ttft = (first if first is not None else t) - self.scheduled[req.row]
        tpot = (t - first) / (req.out - 1) if first is not None and req.out > 1 else None
        ctl, reps = self.green_ctl, self.replicas
        if req.prefill_target >= 0:
            ctl.observe(reps[req.prefill_target].pool, t, ttft, None)
            ctl.observe(reps[req.decode_target].pool, t, None, tpot)
        else:
            ctl.observe(reps[req.target].pool, t, ttft, tpot)

    def _green_tick(self, _: None, t: float) -> None:
        """A green controller's decision: set the pools' SM clocks (runs planned from now on use them)."""
        spec = self.green
        assert spec is not None     # scheduled only with a green spec
        clocks = self.fleet.clocks()
        for pool, clock in self.green_ctl.decide(t, clocks).items():
            if clock != clocks.get(pool):
                self.fleet.set_clock(pool, clock)
                self.clock_log.set(pool, t, clock)
        if self.events_pending():
            self._deliver(t + spec.interval_s, self._green_tick, None)

    def _shrink(self, st: PoolStatus, k: int, t: float) -> None:
        """Remove ``k`` replicas: starting ones first (newest first), then the ready ones with the
        fewest requests in flight; each drains (no new requests) and retires when empty."""
        out = self.view.outstanding_requests
        victims = list(st.starting[::-1]) + sorted(st.ready, key=lambda i: (out[i], -i))
        for i in victims[:k]:
            rep = self.replicas[i]
            rep.starting = False
            rep.draining = True
            self.fleet.refresh_health(rep)
            if rep.idle and not rep.waiting and not rep.entering:
                rep.retire(t)

    def _slow(self, payload: tuple[int, float], t: float) -> None:
        """A scheduled slowdown of one replica starts (or, factor 1, ends)."""
        i, factor = payload
        self._push(self.replicas[i], self.replicas[i].slow_down(factor, t))

    def _experts(self, load: ExpertLoad, t: float) -> None:
        """Expert popularity drifts / EPLB rebalances (sim/moe.py), then again at its next change."""
        load.advance(t)
        self._deliver(load.next_change, self._experts, load)

    def _ready(self, i: int, t: float) -> None:
        rep = self.replicas[i]
        if rep.starting:
            rep.starting = False
            self.fleet.refresh_health(rep)
            self.core.drain()

    def events_pending(self) -> bool:
        """Whether anything but life-cycle events is left to simulate."""
        return self._k < len(self.order) or self._work > 0 or any(not r.idle for r in self.replicas)

    def clock(self) -> float:
        """The simulated time of the event being handled (``View.now`` is the last routing decision's)."""
        return self._now

    def flush(self, end: float) -> None:
        """The run ended at ``end``: the last series samples, then every buffered row to the sinks."""
        self.sampler.sample_until(end, final=True)
        self.recorder.flush()
        self.sampler.flush()

    # ---- summary ------------------------------------------------------------------------------------

    def summary(self, end: float, wall: float) -> RunSummary:
        """The simulator's sections of run.json's summary (run_summary.py); a feature's section only
        where the fleet has it (swap space, adapters, prefix caching, skewed experts, a clock controller)."""
        reps = self.replicas
        energy = sum(r.energy_j if r.down else r.energy_at(end) for r in reps)
        gpu_hours, cost_usd = self.fleet.gpu_hours_and_cost(end)
        caches = [r.kv.cache for r in reps if r.kv.cache is not None]
        s: RunSummary = {
            "sim_time_s": end,
            "wall_s": wall,
            "requests": self.n,
            "status": self.recorder.status_counts(),
            "events": self.events,
            "steps": sum(r.step for r in reps),
            "preemptions": sum(r.preemptions for r in reps),
            "prefill_tokens": sum(r.prefill_tokens for r in reps),
        }
        if any(r.kv.swap_total for r in reps):
            s["swap"] = _swap_summary(reps)
        if any(r.lora is not None for r in reps):
            s["lora"] = _lora_summary(reps)
        s["retries"] = self.retries
        s["failures"] = sum(r.failures for r in reps)
        s["kv_blocks"] = {r.name: r.kv.total for r in reps}
        s["prefix_cache_hit_rate"] = (sum(c.hits for c in caches) / max(1, sum(c.lookups for c in caches))
                                      if caches else None)
        if caches:  # tokens per cached unit of each caching replica (the cache accounting's engine granularity)
            s["prefix_cache_units"] = {r.name: r.bs * r.kv.cache.unit_blocks for r in reps if r.kv.cache is not None}
        s["energy_j"] = energy
        s["attributed_energy_j"] = self.recorder.attributed_energy_j
        s["gpu_hours"] = gpu_hours
        s["cost_usd"] = cost_usd
        s["replicas"] = {"initial": self.cfg.replicas, "added": len(reps) - self.cfg.replicas,
                         "retired": sum(r.retired_at is not None for r in reps)}
        s["mean_utilization"] = (sum(r.busy_s for r in reps) / (gpu_hours * 3600 / reps[0].cost.gpus)
                                 if gpu_hours > 0 and len({r.cost.gpus for r in reps}) == 1 else None)
        s["seed"] = self.seed
        if self.expert_loads:
            s["expert_load"] = {name: _expert_summary(load, end) for name, load in self.expert_loads.items()}
        if self.green is not None:
            s["green"] = self.clock_log.summary(end)
        return s


def _swap_summary(reps: list[Replica]) -> SwapSummary:
    """KV swap totals of the replicas that swap: preemptions that swapped out, swap-ins, preemptions
    that recomputed because the swap space was full, and seconds spent copying over host links."""
    swapping = [r for r in reps if r.kv.swap_total]
    return {"swap_outs": sum(r.kv.swap_outs for r in swapping), "swap_ins": sum(r.kv.swap_ins for r in swapping),
            "recompute_fallbacks": sum(r.kv.swap_fallbacks for r in swapping),
            "transfer_s": sum(r.swap_time_s for r in swapping),
            "swap_blocks": {r.name: r.kv.swap_total for r in swapping}}


def _lora_summary(reps: list[Replica]) -> LoraSummary:
    """LoRA totals of the replicas that serve adapters: adapters copied into GPU slots, read from
    storage into the host cache, the seconds those loads added to steps, and the KV blocks the
    adapter slots took, per replica."""
    serving = [(r.name, r.lora) for r in reps if r.lora is not None]
    return {"loads": {n: a.loads for n, a in serving}, "fetches": {n: a.fetches for n, a in serving},
            "load_time_s": sum(a.load_time_s for _, a in serving),
            "reserved_kv_blocks": {n: a.costs.reserved_blocks for n, a in serving}}


def _expert_summary(load: ExpertLoad, end: float) -> ExpertLoadSummary:
    """A MoE pool's large-batch slowdown (ep x the busiest GPU's share of routed tokens) over the
    run: ``[time, value]`` from each change on, and its time-weighted mean."""
    hist = [(t, f) for t, f in load.history if t <= end]
    spans = [b - a for (a, _), b in zip(hist, [t for t, _ in hist[1:]] + [end])]
    return {"slowdown_history": [[t, f] for t, f in hist],
            "mean_slowdown": sum(f * w for (_, f), w in zip(hist, spans)) / end if end > 0 else hist[0][1]}


def simulate(trace: pa.Table, cfg: ClusterConfig, policy: Policy, run: RunSinks, seed: int = 0,
             users: int | None = None, think_s: float = 0.0) -> RunSummary:
    """Simulate ``trace`` on the cluster ``cfg`` routed by ``policy``; stream rows into ``run``.

    ``run`` has ``.requests`` and ``.series`` sinks (a :class:`~llmlb_bench.store.RunStore`).
    Every trace row yields one REQUESTS row. Same trace, config, policy and seed
    give identical rows; the seed drives random failures (``mtbf_s``) and randomised engine schedulers.
    ``users``: a closed loop of that many users, each sending the trace's next row ``think_s`` after
    its previous request ended (trace_schedule.py); None: open loop at the trace's times.
    Returns the simulator's sections of run.json's summary (run_summary.py).
    """
    wall0 = time.perf_counter()
    # The run keeps hundreds of thousands of small tuples alive (timelines, heaps); CPython's
    # automatic collector would rescan them over and over (a third of the run time). The
    # simulator makes no reference cycles per request, so the collector is paused and only
    # the youngest generation (cycles a policy might make) is collected now and then.
    paused = gc.isenabled()
    gc.disable()
    try:
        sim = Simulation(trace, cfg, policy, run, seed, users, think_s)
        end = sim.run()
        sim.flush(end)
        summary = sim.summary(end, time.perf_counter() - wall0)
        sim.core.detach()    # the run's objects go with ``sim`` (trace_run.py), not at a later collection
        return summary
    finally:
        if paused:
            gc.enable()
