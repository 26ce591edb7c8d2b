"""Load generation across machines: a replay's workers as Ray actors, their clocks corrected.

For loads one machine cannot generate, ``llmlb replay --workers N
--executor ray`` runs the N workers of :mod:`llmlb_bench.replay.workers`
as Ray actors placed with the ``SPREAD`` strategy, so that on a cluster
they land on different nodes. Nothing is shared through a file system:
each actor gets its share of the trace as Arrow IPC bytes and hands its
rows back the same way.

Clocks are the hard part. Each actor times its requests with its own
monotonic ``perf_counter``, which means nothing on another machine, so:

1. the parent measures each actor's wall-clock offset with several round
   trips (:mod:`llmlb_bench.replay.clock`: Cristian's method, the sample
   with the smallest round trip, whose half is the uncertainty);
2. it picks one wall-clock instant for trace time 0 on its own clock and
   tells each actor that instant on the actor's clock (plus its offset),
   which each actor turns into its own ``perf_counter`` origin;
3. each actor reports its rows relative to that origin together with the
   origin read on its own wall clock; the parent maps the origin back
   through the offset onto its own timeline and shifts every timestamp
   (``scheduled_s``, ``sent_s``, token times, series ``t_s``) by the
   difference before merging.

What remains uncertain is each offset's half round trip, and the drift of
the clocks during the run, which is not corrected: the parent measures the
offsets again after the run and stores both in run.json
(``summary.client.ray_workers``) so a reader sees whether it mattered.

Finished rows travel back while the run goes on: the parent takes each
actor's new rows about once a second (:data:`POLL_S`), so what an actor had
finished survives it. A worker that dies (its node lost, its process
killed) leaves the rest without a result: those that were due before the
parent noticed are written as ``error``/``interrupted`` (they may have been
sent), the others as ``not_sent``, and the run is kept as partial for
``--resume``.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from time import perf_counter
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence, TypedDict, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench import interrupts
from llmlb_bench.errors import UserError
from llmlb_bench.policies import Policy
from llmlb_bench.raycluster import ray_session
from llmlb_bench.replay.client import ReplayResult
from llmlb_bench.replay.clock import ClockOffset, measure_offset, perf_instant
from llmlb_bench.replay.options import ReplayOptions
from llmlb_bench.replay.preflight import Preflight
from llmlb_bench.replay.resume import Resume
from llmlb_bench.replay.runner import Replayer
from llmlb_bench.replay.workers import WorkerOutcome, PartStore, merge_outcomes, plan_workers
from llmlb_bench.run_summary import RunSummary
from llmlb_bench.schema import REQUESTS, SERIES
from llmlb_bench.store import RunStore
from llmlb_bench.store.parts import read_parts
from llmlb_bench.store.sink import rows_table

#: the common start lies this far ahead of the moment the parent sends it, so that every actor has it
#: in time even on a busy cluster (a Ray call takes milliseconds; an actor that hears it late only
#: starts late, which its dispatch lag shows)
START_MARGIN_S = 0.5
#: how long the actors may go without another of them getting ready when the cluster had fewer free CPUs
#: than actors as they were created (other work may hold its CPUs for good, and then some are never
#: placed); with a CPU free for each they are waited for however slow the machine is to start them
#: (pinned to one busy core, two actors of a private instance took over 120 s, and two on a joined one)
READY_TIMEOUT_S = 120.0
#: how often the wait for the actors looks for Ctrl-C
_READY_SLICE_S = 0.2
#: seconds between the parent's collections of the actors' finished rows
POLL_S = 1.0
#: result columns that are times on the replay's timeline
_REQUEST_TIMES = ("scheduled_s", "sent_s", "first_token_s", "last_token_s")

_T = TypeVar("_T")


class Place(TypedDict):
    """Where an actor runs (``ReplayActor.prepare``)."""

    node_id: str
    hostname: str
    pid: int


class TakenRows(TypedDict):
    """Rows an actor finished (Arrow IPC bytes) and the origin their times count from, on its wall clock."""

    requests: bytes
    t0_wall_s: float


class ActorResult(TakenRows):
    """What an actor's run hands back (``ReplayActor.run``)."""

    series: bytes
    summary: RunSummary
    interrupted: bool
    lateness: np.ndarray


class RowTap:
    """An actor's requests sink: finished rows kept in memory until the parent takes them.

    The replayer's writer thread writes; a Ray call on the actor's second
    thread takes (:meth:`ReplayActor.take_rows`)."""

    def __init__(self, run_id: str) -> None:
        self._constants = {"run_id": run_id}
        self._lock = threading.Lock()
        self._tables: list[pa.Table] = []

    def write(self, columns: Mapping[str, Sequence[object] | pa.Array]) -> None:
        table = rows_table(REQUESTS, columns, self._constants)
        if table is not None:
            with self._lock:
                self._tables.append(table)

    #: rows are durable once the parent has taken them; nothing here to flush
    pending_rows = 0

    def flush_if_due(self) -> None:
        pass

    def take(self) -> pa.Table:
        """Every row written since the last call."""
        with self._lock:
            tables, self._tables = self._tables, []
        return pa.concat_tables(tables) if tables else REQUESTS.schema.empty_table()

    def close(self) -> None:
        """Nothing to flush: rows leave through :meth:`take`."""


class ReplayActor:
    """One load generator on a Ray node: replays its share on its own clocks, hands its rows back as data.

    ``clock`` is the wall clock the parent's offset measurement reads and the
    start instant is given in (injectable so tests can skew it).
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._replayer: Replayer | None = None
        self._part: PartStore | None = None
        self._tap: RowTap | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._t0_own: float | None = None
        self._stopped = False

    def prepare(self, share: bytes, pre: Preflight, policy: Policy, options: ReplayOptions,
                run_id: str) -> Place:
        """Build the replayer for this share (rows in a node-local folder until the run ends); where it is."""
        import ray

        self._tmp = tempfile.TemporaryDirectory(prefix="llmlb-replay-")
        self._tap = RowTap(run_id)
        self._part = PartStore(Path(self._tmp.name), run_id, requests=self._tap)
        self._replayer = Replayer(_from_ipc(share), pre, policy, self._part, options)
        return {"node_id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname(),
                "pid": os.getpid()}

    def now(self) -> float:
        """This actor's wall clock (one ping of the offset measurement)."""
        return self._clock()

    def run(self, t0_wall: float) -> ActorResult:
        """Replay with trace time 0 at ``t0_wall`` on this actor's clock; rows relative to that origin."""
        replayer, part, tap, tmp = self._replayer, self._part, self._tap, self._tmp
        assert replayer is not None and part is not None and tap is not None and tmp is not None
        replayer.t0_clock = perf_instant(t0_wall, self._clock)
        # the origin as this actor's wall clock reads it now (the parent maps it through the offset)
        t0_own = self._t0_own = self._clock() - (perf_counter() - replayer.t0_clock)
        interrupted = self._stopped
        try:
            if not interrupted:
                replayer.run()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            part.close()
        try:
            return {"requests": _to_ipc(tap.take()),
                    "series": _to_ipc(read_parts(part.series.path, SERIES)),
                    "summary": part.summary, "interrupted": interrupted,
                    "lateness": np.asarray(replayer.lateness, dtype=float), "t0_wall_s": t0_own}
        finally:
            tmp.cleanup()

    def take_rows(self) -> TakenRows | None:
        """The rows finished since the last call, and the origin their times count from (None before
        the run has started)."""
        if self._t0_own is None or self._tap is None:
            return None
        return {"requests": _to_ipc(self._tap.take()), "t0_wall_s": self._t0_own}

    def stop(self) -> None:
        """Ctrl-C for this actor: the replay stops as a single replayer does on SIGINT, rows written."""
        self._stopped = True
        replayer = self._replayer
        if replayer is not None and replayer.loop is not None:
            loop = replayer.loop
            try:
                loop.call_soon_threadsafe(_interrupt_when_started, replayer)
            except RuntimeError:  # the loop has already closed: the run is over
                pass


def _interrupt_when_started(replayer: Replayer) -> None:
    """Interrupt the replayer once its main task runs (an interrupt before that would be lost)."""
    assert replayer.loop is not None
    if replayer._main_task is None:
        replayer.loop.call_soon(_interrupt_when_started, replayer)
    else:
        replayer._interrupt()


def replay_on_ray(trace: pa.Table, pre: Preflight, policy: Policy, run: RunStore, options: ReplayOptions,
                  resume: Resume | None = None, *,
                  clocks: Sequence[Callable[[], float]] | None = None) -> ReplayResult:
    """Replay with ``options.workers`` Ray actors (cluster ``options.address``); same results as the
    process workers, on the parent's timeline. ``clocks`` replaces each actor's wall clock (tests)."""
    plan = plan_workers(trace, run, options, resume)
    n = options.workers
    details: list[dict[str, object]] = [{"rows": len(rows)} for rows in plan.shares]
    outcomes = [WorkerOutcome() for _ in range(n)]
    stop = {"signalled": False}
    with ray_session(options.address, n) as ray:
        free = ray.available_resources().get("CPU", 0.0)    # before the actors take theirs
        actor_class = ray.remote(ReplayActor)
        actors = [actor_class.options(num_cpus=1, max_concurrency=2, scheduling_strategy="SPREAD",
                                      max_restarts=0).remote(*([clocks[k]] if clocks else []))
                  for k in range(n)]

        def forward(signum: int, frame: object) -> None:
            stop["signalled"] = True
            interrupts.note(signum)
            for actor in actors:
                actor.stop.remote()

        saved = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            prepared = [actor.prepare.remote(_to_ipc(plan.trace.take(rows)), pre, policy, opts, run.run_id)
                        for actor, rows, opts in zip(actors, plan.shares, plan.options)]
            _wait_ready(ray, prepared, stop, bounded=free < n)
            live: dict[int, ClockOffset] = {}
            for k, ref in enumerate(prepared if not stop["signalled"] else ()):
                place, error = _get(ray, partial(ray.get, ref))
                offset, error = (None, error) if error else _get(ray, partial(_offset, ray, actors[k]))
                if offset is None:
                    details[k]["error"] = error
                    continue
                assert place is not None        # no error: the actor answered
                details[k].update(place, **offset.describe())
                live[k] = offset
            # trace time 0 on the parent's wall clock, and the same instant on its perf_counter
            t0_wall = time.time() + START_MARGIN_S + options.start_delay_s - plan.origin
            t0 = perf_instant(t0_wall)
            running = {actors[k].run.remote(t0_wall + off.offset_s): k for k, off in live.items()
                       if not stop["signalled"]}
            streamed: list[list[pa.Table]] = [[] for _ in range(n)]   # rows taken while running
            asked: dict[Any, int] = {}      # take_rows calls not answered yet (at most one per actor): Ray's refs
            next_poll = perf_counter() + POLL_S
            while running:
                done, _ = ray.wait(list(running), num_returns=1, timeout=0.2)
                for ref in done:
                    k = running.pop(ref)
                    for call in [c for c, j in asked.items() if j == k]:   # rows it took before the end
                        _collect(ray, call, asked.pop(call), live, t0_wall, streamed)
                    result, error = _get(ray, partial(ray.get, ref))
                    if error is None:
                        assert result is not None   # no error: the actor answered
                        outcomes[k] = _outcome(result, live[k], t0_wall, details[k])
                        after, _ = _get(ray, partial(_offset, ray, actors[k]))  # the drift, not corrected
                        details[k]["offset_after_s"] = after.offset_s if after is not None else None
                        details[k]["uncertainty_after_s"] = after.rtt_s / 2 if after is not None else None
                    else:  # the actor is gone: it stopped sending by now at the latest
                        details[k]["error"] = error
                        outcomes[k].lost_s = perf_counter() - t0
                    outcomes[k].requests = _concat([*streamed[k], outcomes[k].requests])
                if running and perf_counter() >= next_poll:
                    next_poll = perf_counter() + POLL_S
                    waiting = set(asked.values())
                    asked.update({actors[k].take_rows.remote(): k for k in running.values() if k not in waiting})
                if asked:
                    answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=0)
                    for call in answered:
                        _collect(ray, call, asked.pop(call), live, t0_wall, streamed)
        finally:
            for s, handler in saved.items():
                signal.signal(s, handler)
    summary = merge_outcomes(plan, run, outcomes, options, t0, pre)
    client = summary["client"]          # the run's summary.client too
    client["clock"] = ("time.perf_counter of the parent; actors' times mapped onto it through their measured "
                       "wall-clock offsets")
    client["ray_workers"] = details
    if stop["signalled"] or summary["interrupted"]:
        raise KeyboardInterrupt("replay interrupted")
    return summary


def _wait_ready(ray: ModuleType, prepared: list[Any], stop: dict[str, bool], bounded: bool) -> None:
    """Until every actor is prepared, or Ctrl-C (``stop``), which a single long wait heard only once all
    were ready or :data:`READY_TIMEOUT_S` had passed, and then reported as that error. ``bounded``: a
    one-line error once that long passes without another actor getting ready."""
    n, ready, since = len(prepared), 0, perf_counter()
    while ready < n and not stop["signalled"]:
        now_ready = len(ray.wait(prepared, num_returns=n, timeout=_READY_SLICE_S)[0])
        if now_ready > ready:
            ready, since = now_ready, perf_counter()
        elif bounded and perf_counter() - since > READY_TIMEOUT_S:
            raise UserError(f"only {ready} of {n} Ray actors were ready within {READY_TIMEOUT_S:g} s "
                            f"(each needs one free CPU on the cluster)", "--workers")


def _get(ray: ModuleType, call: Callable[[], _T]) -> tuple[_T | None, str | None]:
    """``(value, None)`` from a call to an actor, or ``(None, what went wrong in one line)``; a
    user's mistake found in an actor is raised as the one-line error it is."""
    try:
        return call(), None
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, UserError):
            raise exc.cause from None
        return None, f"{type(exc.cause).__name__}: {exc.cause}".splitlines()[0]
    except ray.exceptions.RayError as exc:  # the actor died: node lost, process killed
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"


def _offset(ray: ModuleType, actor: Any) -> ClockOffset:
    return measure_offset(lambda: ray.get(actor.now.remote()))


def _collect(ray: ModuleType, call: Any, k: int, live: dict[int, ClockOffset], t0_wall: float,
             streamed: list[list[pa.Table]]) -> None:
    """Actor ``k``'s answer to a ``take_rows`` call: its new rows, moved onto our timeline. A call is
    only made again once answered, so no rows are taken twice or left behind unread (those of a
    dead actor's last call are lost with it, and its requests written like its others)."""
    got, _ = _get(ray, lambda: ray.get(call))
    if got is not None:
        rows = _from_ipc(got["requests"])
        if rows.num_rows:
            streamed[k].append(shift_requests(rows, got["t0_wall_s"] - live[k].offset_s - t0_wall))


def _concat(tables: Sequence[pa.Table | None]) -> pa.Table | None:
    present = [t for t in tables if t is not None]
    return pa.concat_tables(present) if present else None


def _outcome(result: ActorResult, offset: ClockOffset, t0_wall: float, detail: dict[str, object]) -> WorkerOutcome:
    """An actor's result on the parent's timeline: its origin, read on its clock, mapped through the offset."""
    shift = result["t0_wall_s"] - offset.offset_s - t0_wall
    detail["shift_s"] = shift
    return WorkerOutcome(requests=shift_requests(_from_ipc(result["requests"]), shift),
                         series=_shift_columns(_from_ipc(result["series"]), ("t_s",), shift),
                         summary=result["summary"], lateness=result["lateness"],
                         interrupted=result["interrupted"])


def shift_requests(table: pa.Table, shift: float) -> pa.Table:
    """Result rows with every time (``token_times`` segment starts too) moved by ``shift`` seconds."""
    table = _shift_columns(table, _REQUEST_TIMES, shift)
    tokens = table.column("token_times").combine_chunks()
    segments = tokens.values
    moved = pa.StructArray.from_arrays(
        [pc.add(segments.field("start_s"), shift), segments.field("gap_s"), segments.field("count")],
        fields=list(segments.type))
    tokens = pa.ListArray.from_arrays(tokens.offsets, moved, type=tokens.type, mask=tokens.is_null())
    return table.set_column(table.schema.get_field_index("token_times"), table.schema.field("token_times"), tokens)


def _shift_columns(table: pa.Table, names: Sequence[str], shift: float) -> pa.Table:
    for name in names:
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.schema.field(name), pc.add(table.column(name), shift))
    return table


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()
