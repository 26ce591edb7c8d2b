"""The open-loop replayer: sends each trace request at its scheduled time and records what happened.

Timing model (all times are seconds on one clock, ``time.perf_counter``,
shifted so that 0 is the trace's time 0):

* ``scheduled_s``: when the trace says the request leaves (``arrival_s`` x
  ``time_scale``; for a dependent request, its parent's end plus
  ``after_parent_s`` when that is later). Requests leave at these times
  whatever happened to earlier ones (open loop), so a slow server cannot
  slow the offered load down: no coordinated omission.
* ``sent_s``: when its bytes were handed to the socket (first attempt).
  ``sent_s - scheduled_s`` is the client's lateness plus, on a new
  connection, the connection setup. The client's own part (when the
  dispatcher got to the request, minus ``scheduled_s``) is the dispatch lag
  reported in run.json as the self-check.
* ``first_token_s`` / ``last_token_s`` / ``token_times``: when the socket
  read that carried the first / last / each token chunk returned.

One event loop (uvloop where it has wheels: llmlb_bench.eventloop) runs
everything: a dispatcher that sleeps until about 1.5 ms before the next
send and then polls the loop until the exact time (timer wake-ups are
only millisecond-precise), the connections' protocol callbacks, one timer
per request for its timeouts, and a row writer that hands finished rows
to a background thread.

The Replayer is the run's orchestration (clock, dispatch, the books of what is in flight,
progress, close); its parts: what each request says (:mod:`llmlb_bench.replay.bodies`), each
request's attempts, timeouts and retries (:mod:`llmlb_bench.replay.attempts`), the result rows
(:mod:`llmlb_bench.replay.results`), endpoint health and revival
(:mod:`llmlb_bench.replay.probes`), the ``/metrics`` scrape loop (:mod:`llmlb_bench.replay.scraper`).

Every trace row gets exactly one result row: ``ok``, ``error``,
``timeout``, ``rejected`` (HTTP 429, or refused by the routing policy), or
``not_sent`` (the run was interrupted first, or the policy still held it when
the trace was over: ``HELD_AT_END``, as in the simulator). A request in flight when the
run is interrupted is written as ``error`` with error ``interrupted``.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import resource
import signal
import sys
import threading
from collections import deque
from time import perf_counter
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa

from llmlb_bench import interrupts
from llmlb_bench.errors import UserError
from llmlb_bench.eventloop import new_event_loop
from llmlb_bench.openfiles import raise_open_files_limit
from llmlb_bench.policies import Outcome, Policy, PolicyError, RouteRequest, TargetInfo, View
from llmlb_bench.policies.base import set_now
from llmlb_bench.replay.attempts import Attempts
from llmlb_bench.replay.bodies import Bodies
from llmlb_bench.replay.flight import Flight
from llmlb_bench.replay.http import Pool
from llmlb_bench.replay.options import ReplayOptions, ReplayProgress
from llmlb_bench.replay.client import ReplayResult, client_summary, replay_summary
from llmlb_bench.replay.preflight import Preflight, request_headers
from llmlb_bench.replay.probes import Health
from llmlb_bench.replay.prompts import PromptBuilder
from llmlb_bench.replay.resume import INTERRUPTED, Resume
from llmlb_bench.replay.results import ResultRows
from llmlb_bench.replay.rows import RowWriter
from llmlb_bench.replay.scraper import Scraper
from llmlb_bench.replay.threads import Threads
from llmlb_bench.schema import trace_block_size
from llmlb_bench.store import RunStore

if TYPE_CHECKING:  # a worker's part of a run (workers.py imports this module)
    from llmlb_bench.replay.workers import PartStore
from llmlb_bench.trace_columns import TraceColumns
from llmlb_bench.trace_run import Backend, TraceRun
from llmlb_bench.trace_schedule import TraceSchedule

_INF = float("inf")

#: the dispatcher stops sleeping this long before a send and polls the loop instead
_SPIN_S = 0.0015
#: dispatches in a row before the dispatcher lets I/O run (when it is behind schedule)
_BURST = 32
#: connections each endpoint's pool keeps open ahead of need (see http.Pool); the first ones are
#: opened during the start delay
_SPARE_CONNECTIONS = 8
#: how long a thread waits for the GIL before asking for it, while the replay runs (default 5 ms)
_SWITCH_S = 0.0002


class Replayer(Backend):
    """One replay run; use :func:`replay`."""

    def __init__(self, trace: pa.Table, pre: Preflight, policy: Policy, run: RunStore | PartStore,
                 options: ReplayOptions, resume: Resume | None = None, t0_clock: float | None = None) -> None:
        if options.time_scale <= 0:
            raise UserError("must be positive", "--time-scale")
        self.options = options
        self.pre = pre
        self.policy = policy
        self.run_store = run
        self.resume = resume
        self.tr = tr = TraceColumns(trace, options.time_scale)
        self.prompts = PromptBuilder(trace_block_size(trace), pre.word_costs, pre.lead_costs)
        #: dependent requests' prompts from their parents' real answers (open loop only: closed
        #: loop sends rows in order, without their parents)
        self.threads = Threads(tr, self.prompts, options.api == "chat") \
            if options.thread and options.users is None else None
        self.view = View(targets=[TargetInfo(name=ep.url) for ep in pre.endpoints],
                         block_size=trace_block_size(trace), healthy=pre.healthy)
        self.names = [ep.url for ep in pre.endpoints]
        self.pools = [Pool(ep, options.timeouts.connect, spare=_SPARE_CONNECTIONS) for ep in pre.endpoints]
        self.headers = request_headers(options)
        #: what each request says (bodies.py)
        self.bodies = Bodies(tr, pre, options, self.prompts, self.threads, self.headers)
        self.writer = RowWriter(run.requests)
        if options.users is not None and options.users < 1:
            raise UserError("must be at least 1", "--users")
        #: when each row leaves: roots, dependents, closed-loop users (trace_schedule.py)
        self.schedule = TraceSchedule(tr, resume.done_ids if resume else None, options.users,
                                      options.think_s * options.time_scale)
        self.sched = self.schedule.due
        #: the policy in front of the endpoints and the run around it (trace_run.py): decisions, router
        #: queue, the view's books, dependents released, every row written once
        self.core = TraceRun(policy, self.view, tr, self.schedule, self, on_policy_error=self._policy_failed)
        self.router = self.core.router
        #: every trace row's result row, counted by status (results.py)
        self.rows = ResultRows(tr, self.sched, self.names, self.writer)
        #: the dispatcher's place in the schedule's roots, and the released rows by due time
        self._pos = 0
        self._ready: list[tuple[float, int]] = []
        self.flights: set[Flight] = set()
        self.lateness: list[float] = []
        self.recent_ttft: deque[float] = deque(maxlen=512)
        #: endpoints marked down when they refuse connections, and brought back (probes.py)
        self.health = Health(self.view, self.pools)
        #: each request's attempts, timeouts and retries (attempts.py); its outcome comes back to :meth:`_ended`
        self.attempts = Attempts(self.pools, self.health, options, ended=self._ended)
        self.scraper = Scraper(self.pools, self.names, self.view, self.headers,
                               clock=lambda: perf_counter() - self.t0, write=run.series.write)
        self.last_end: float | None = None
        self.dispatch_done = False
        self.interrupted = False
        #: ``perf_counter()`` at trace time 0; given by the parent when several workers share a run
        self.t0 = 0.0
        self.t0_clock = t0_clock
        self.loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Future[None] | None = None
        self._all_done: asyncio.Future[None] | None = None
        self._main_task: asyncio.Task[None] | None = None
        self.loop_kind = "asyncio"
        #: a policy that broke the contract on a callback (see :meth:`_policy_failed`); raised when the run ends
        self.policy_error: PolicyError | None = None

    # -- event loop and signals ---------------------------------------------
    def run(self) -> ReplayResult:
        loop, self.loop_kind = new_event_loop()
        self.loop = self.attempts.loop = loop
        raise_open_files_limit()
        cpu0 = _cpu_seconds()
        restore = self._install_signals(loop)
        # the trace columns live for the whole run: keep the collector's full passes, which stop
        # the event loop, from walking them again and again
        gc.collect()
        gc.freeze()
        # the row writer thread converts and writes rows while the loop runs; by default a thread
        # that wants the GIL waits 5 ms before asking for it, which the dispatcher would pay as lateness
        switch = sys.getswitchinterval()
        sys.setswitchinterval(_SWITCH_S)
        try:
            loop.run_until_complete(self._main())
        finally:
            sys.setswitchinterval(switch)
            gc.unfreeze()
            restore()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self.writer.close()
        summary = self._summary(_cpu_seconds() - cpu0)
        if self.policy_error is not None:
            raise self.policy_error
        if self.interrupted:
            raise KeyboardInterrupt("replay interrupted")
        return summary

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        """Ctrl-C and SIGTERM stop the run cleanly (rows written) instead of raising mid-callback."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in saved:
            loop.add_signal_handler(s, self._signalled, s)

        def restore() -> None:
            for s, handler in saved.items():
                loop.remove_signal_handler(s)
                signal.signal(s, handler)
        return restore

    def _signalled(self, signum: int) -> None:
        interrupts.note(signum)   # a later Ctrl-C, once the handlers are back, is one to ignore
        self._interrupt()

    def _interrupt(self) -> None:
        if self.interrupted:
            return  # a second Ctrl-C must not cut the cleanup that writes the remaining rows
        self.interrupted = True
        if self._main_task is not None:
            self._main_task.cancel()

    # -- main ----------------------------------------------------------------
    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        self._main_task = asyncio.current_task()
        self._all_done = loop.create_future()
        origin = 0.0
        if self.resume is not None:
            self.rows.carry(self.resume.carried)
            origin = self.schedule.first_due()
        self.t0 = self.t0_clock if self.t0_clock is not None else \
            perf_counter() + self.options.start_delay_s - origin
        self.writer.buffer.origin = self.t0
        for pool in self.pools:
            pool.top_up()
        background = [loop.create_task(self._flush_periodically()),
                      loop.create_task(self.health.revive())]
        if self.options.progress is not None:
            background.append(loop.create_task(self._report_progress()))
        scraper = loop.create_task(self.scraper.run(self.options.scrape_s)) if self.options.scrape_s else None
        if scraper is not None:
            background.append(scraper)
        try:
            await self._dispatch_all()
            self.dispatch_done = True
            self._check_done()
            await self._all_done
            if scraper is not None:
                # one last scrape once every answer is in, so the series' counter increases cover the
                # whole run (the first scrape precedes the first answer)
                scraper.cancel()
                await self.scraper.round(self.options.scrape_s)  # type: ignore[arg-type]  # a scraper: scrape_s set
        except asyncio.CancelledError:
            self.interrupted = True
        finally:
            for task in background:
                task.cancel()
            self._shutdown()
            await self.writer.drain()

    async def _sleep(self, delay: float | None) -> None:
        """Sleep that ends early when a dependent request becomes ready."""
        loop = self.loop
        assert loop is not None
        fut = self._wake = loop.create_future()
        handle = loop.call_later(delay, _resolve, fut) if delay is not None else None
        try:
            await fut
        finally:
            self._wake = None
            if handle is not None:
                handle.cancel()

    def _peek(self) -> float:
        """Time of the next request that can leave (INF: none until a request ends)."""
        sch = self.schedule
        nxt = self.sched[sch.roots[self._pos]] if self._pos < sch.initial else _INF
        return min(nxt, self._ready[0][0]) if self._ready else nxt

    def _pop(self) -> int:
        """The next request (after :meth:`_peek` gave a finite time): a root or a released row, by time."""
        sch, ready = self.schedule, self._ready
        if ready and (self._pos >= sch.initial or ready[0][0] < self.sched[sch.roots[self._pos]]):
            return heapq.heappop(ready)[1]
        self._pos += 1
        return sch.roots[self._pos - 1]

    def arrive_at(self, row: int, due: float) -> None:
        """A row was released (its parents ended, or its user's last request): it leaves at ``due``."""
        heapq.heappush(self._ready, (due, row))
        self._wake_dispatcher()

    def _wake_dispatcher(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)  # a released row may be due before the dispatcher's next wake-up

    async def _dispatch_all(self) -> None:
        burst = 0
        while True:
            nxt = self._peek()
            if nxt == _INF:
                if not self.schedule.waiting or not self.flights:
                    return  # nothing left, or nothing in flight that could release what waits
                await self._sleep(None)  # until a request ends
                continue
            delay = nxt - (perf_counter() - self.t0)
            if delay > _SPIN_S:
                burst = 0
                await self._sleep(delay - _SPIN_S)
                continue
            if delay > 0 or burst >= _BURST:
                burst = 0
                await asyncio.sleep(0)
                continue
            burst += 1
            self._dispatch(self._pop())

    # -- routing and sending -------------------------------------------------
    def _dispatch(self, idx: int) -> None:
        tr = self.tr
        # the self-check: how late the client itself handled the request (connection setup,
        # which also sits between scheduled_s and sent_s, belongs to the network, not the client)
        self.lateness.append(perf_counter() - self.t0 - self.sched[idx])
        try:
            self.core.arrive(idx, self.sched[idx], perf_counter() - self.t0)
        except PolicyError as exc:   # ends the run (raised out of the dispatcher); the row is written first
            if tr.rid[idx] not in self.router.held:
                self.rows.write(idx, None, "error", exc.problem)
            raise

    def _policy_failed(self, exc: PolicyError) -> None:
        """The policy broke its contract while its queue drained on a callback: stop the run from here."""
        if self.policy_error is None:
            self.policy_error = exc
        if self._main_task is not None:
            self._main_task.cancel()

    def write(self, row: int, target: str | None, status: str, error: str | None) -> None:
        """The row of a request that never left for an endpoint (refused, held at the end, never released)."""
        if self.threads is not None:
            self.threads.ended(row)
        self.rows.write(row, None, status, error)

    def clock(self) -> float:
        """Seconds since the replay's origin."""
        return perf_counter() - self.t0

    def launch(self, row: int, route: RouteRequest, target: int, decode_target: int) -> None:
        """The router sent row ``row`` to endpoint ``target`` (the run's books already say so; an
        endpoint is never a disaggregated pair, so ``decode_target`` is -1)."""
        f = Flight(row, route, target, self.bodies.request(row, target), self.sched[row], self.attempts)
        if self.threads is not None and self.threads.keeps(row):
            f.answer = []  # something waits for this answer: keep its text
        self.flights.add(f)
        self.attempts.attempt(f)

    def _ended(self, f: Flight, status: str, error: str | None, now: float) -> None:
        """The request's outcome is known (its attempts are over): write its row, update the books,
        release dependents."""
        self.flights.discard(f)
        if self.threads is not None:
            if status == "ok" and f.answer is not None:
                # the answer's tokens: the history a next turn extends keeps no reasoning
                self.threads.answered(f.idx, "".join(f.answer), f.output_tokens()[0] - (f.reasoning_tokens() or 0))
            self.threads.ended(f.idx)
        self.rows.write(f.idx, f, status, error)
        if status == "ok" and f.first is not None and f.sent is not None:
            self.recent_ttft.append(f.first - f.sent)
        end = self.last_end = now - self.t0
        set_now(self.view, end)
        if self.router.observes:    # on the run clock, as the route's arrival_s (the scheduled time)
            f.route.outcome = Outcome(status, None if f.first is None else f.first - self.t0, end,
                                      f.output_tokens()[0], f.cached)
        self.core.ended(f.idx, f.target, f.route, end)
        if not self.flights:
            self._wake_dispatcher()   # it may wait for rows that nothing in flight can release any more
        self._check_done()

    def _check_done(self) -> None:
        if self.dispatch_done and not self.flights:
            # the policy still holds requests nothing will release; rows waiting for them were never sent
            self.core.close()
            if self._all_done is not None and not self._all_done.done():
                self._all_done.set_result(None)

    def _shutdown(self) -> None:
        """Interrupt or end: close every row that is still open, then the connections."""
        self.core.draining = False
        now = perf_counter()
        self.attempts.cancel_connects()
        for f in list(self.flights):
            self.attempts.finished(f, "error", INTERRUPTED, now)
        self.core.close(untaken_error=None)   # interrupted: the unsent rows were simply not reached
        for pool in self.pools:
            pool.close_all()

    # -- background tasks ----------------------------------------------------
    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.writer.submit()

    async def _report_progress(self) -> None:
        assert self.options.progress is not None
        while True:
            await asyncio.sleep(0.5)
            self.options.progress(self.counters())

    def counters(self) -> ReplayProgress:
        """Live figures for a progress display."""
        ttft, status = sorted(self.recent_ttft), self.rows.status
        return {"sent": self.attempts.sent, "in_flight": len(self.flights), "done": sum(status.values()),
                "errors": sum(v for k, v in status.items() if k != "ok"),
                "total": self.tr.n, "ttft_p50_ms": ttft[len(ttft) // 2] * 1e3 if ttft else None}

    # -- summary -------------------------------------------------------------
    def _summary(self, cpu_s: float) -> ReplayResult:
        sent, first, last = self.attempts.sent, self.attempts.first_sent_at, self.attempts.last_sent_at
        client = client_summary(np.asarray(self.lateness), cpu_s, sent, self.loop_kind, self.t0,
                                self.options.lag_threshold_ms)
        replay = replay_summary(self.rows.status, sent, None if first is None else first - self.t0,
                                None if last is None else last - self.t0, self.last_end,
                                self.interrupted, self.pre, self.scraper.scraped)
        replay["multimodal_dropped"] = self.bodies.media_dropped
        if self.resume is not None:
            replay["resumed"] = {"carried_rows": self.resume.carried.num_rows}
        self.run_store.summary["client"] = client
        self.run_store.summary["replay"] = replay
        return {"client": client, **replay}


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime
