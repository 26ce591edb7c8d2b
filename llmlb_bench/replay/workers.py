"""Several client processes for one replay run, when one core cannot keep the schedule.

The trace is split into shares: whole families (a request and everything
that depends on it, so dependencies stay inside one process) dealt out in
order of first arrival, or, in closed loop, rows dealt out with the users.
Each worker is a fresh process (``spawn``: no state shared by accident)
running the ordinary replayer on its share, with its own copy of the
routing policy, so a load-aware policy sees only its own process's
in-flight requests; only the first worker scrapes ``/metrics``. All workers
start from the same clock origin, sent to them once every one of them is
ready, so their times are directly comparable (``CLOCK_MONOTONIC`` is
system-wide). Each writes its rows to a part file; the parent merges them
into the run, writes ``not_sent`` for anything a failed worker left
without a row, and combines the self-check figures. Ctrl-C or SIGTERM is
passed on to the workers as SIGINT, which they handle like a single
replayer does.

With ``executor="ray"`` the workers are Ray actors instead, possibly on
other machines (:mod:`llmlb_bench.replay.ray_workers`); the split, the
merge and the rows for lost requests are the same code.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from multiprocessing.connection import Connection
import os
import shutil
import signal
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from time import perf_counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench import interrupts
from llmlb_bench.errors import UserError
from llmlb_bench.policies import Policy
from llmlb_bench.replay.options import ReplayOptions
from llmlb_bench.replay.preflight import Preflight
from llmlb_bench.replay.resume import INTERRUPTED, Resume
from llmlb_bench.replay.rows import RequestsSink, write_table
from llmlb_bench.replay.client import ReplayResult, client_summary, replay_summary
from llmlb_bench.run_summary import RunSummary
from llmlb_bench.replay.runner import Replayer
from llmlb_bench.schema import REQUESTS, SERIES
from llmlb_bench.store import ParquetSink, RunStore
from llmlb_bench.store.parts import read_parts, table_files
from llmlb_bench.trace_columns import TraceColumns
from llmlb_bench.trace_schedule import TraceSchedule


def shares(table: pa.Table, n: int, closed_loop: bool) -> list[list[int]]:
    """Row indices of each worker's share: whole families (open loop: a request, everything that
    waits for it and everything it waits for, joins included, so a conversation's turns and its
    prompts' threading stay in one process) or single rows (closed loop), dealt out in order of
    arrival."""
    tr = TraceColumns(table)
    root = list(range(tr.n))

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    if not closed_loop:
        for row, deps in tr.waited_rows().items():
            for d in deps:
                a, b = find(row), find(d)
                if a != b:
                    root[max(a, b)] = min(a, b)
    family_worker: dict[int, int] = {}
    out: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(tr.n), key=lambda i: (tr.arrival[i], i)):
        out[family_worker.setdefault(find(i), len(family_worker) % n)].append(i)
    return out


class PartStore:
    """What a worker's replayer writes to: the run store's sinks and summary, in a part folder."""

    def __init__(self, folder: Path, run_id: str, requests: RequestsSink | None = None) -> None:
        """``requests``: another sink for the rows, instead of ``folder/requests.parquet``."""
        folder.mkdir(parents=True, exist_ok=True)
        self.requests: RequestsSink = requests if requests is not None else ParquetSink(
            folder / "requests.parquet", REQUESTS, constants={"run_id": run_id})
        self.series = ParquetSink(folder / "series.parquet", SERIES, constants={"run_id": run_id})
        self.summary: RunSummary = {}

    def close(self) -> None:
        try:
            self.requests.close()
        finally:
            self.series.close()


def _worker(table: pa.Table, pre: Preflight, policy: Policy, options: ReplayOptions, folder: str,
            run_id: str, conn: Connection[str, float]) -> None:
    """One worker process: get ready, wait for the shared clock origin, replay the share."""
    part = PartStore(Path(folder), run_id)
    replayer = None
    interrupted = False
    try:
        replayer = Replayer(table, pre, policy, part, options)
        conn.send("ready")
        try:
            replayer.t0_clock = conn.recv()
        except EOFError:  # the parent stopped before the start: nothing is sent
            raise KeyboardInterrupt from None
        replayer.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        part.close()
        lateness = np.asarray(replayer.lateness if replayer is not None else [], dtype=float)
        np.save(Path(folder) / "lateness.npy", lateness)
        (Path(folder) / "summary.json").write_text(
            json.dumps({"summary": part.summary, "interrupted": interrupted}, default=str))


@dataclass
class WorkerPlan:
    """What the workers of one run get: the rows left to send, each worker's share and options."""

    trace: pa.Table
    shares: list[list[int]]
    options: list[ReplayOptions]
    #: statuses of the rows a resumed run carries over (already written to the run)
    carried: dict[str, int]
    #: trace time at which the schedule (re)starts
    origin: float


def plan_workers(trace: pa.Table, run: RunStore, options: ReplayOptions, resume: Resume | None) -> WorkerPlan:
    """Split the run into ``options.workers`` shares; a resumed run's finished rows go to the run now."""
    n = options.workers
    closed = options.users is not None
    if closed and options.users < n:  # type: ignore[operator]
        raise UserError(f"{options.users} users cannot be shared by {n} workers", "--workers")
    carried: dict[str, int] = {}
    origin = 0.0
    if resume is not None:
        write_table(run.requests, resume.carried)
        carried = dict(Counter(resume.carried.column("status").to_pylist()))
        done = pa.array(sorted(resume.done_ids), pa.int64())
        trace = trace.filter(pc.invert(pc.is_in(trace.column("request_id"), value_set=done)))
        # the schedule restarts at the first request left, as in a single process
        origin = TraceSchedule(TraceColumns(trace, options.time_scale), None, options.users,
                               options.think_s * options.time_scale).first_due()
    opts = []
    for k in range(n):
        users = None if not closed else options.users // n + (1 if k < options.users % n else 0)  # type: ignore[operator]
        opts.append(replace(options, workers=1, users=users, progress=None,
                            scrape_s=options.scrape_s if k == 0 else None))
    return WorkerPlan(trace, shares(trace, n, closed), opts, carried, origin)


def replay_in_workers(trace: pa.Table, pre: Preflight, policy: Policy, run: RunStore, options: ReplayOptions,
                      resume: Resume | None = None) -> ReplayResult:
    """Replay with ``options.workers`` local processes; same results as one replayer, merged
    (:func:`llmlb_bench.replay.ray_workers.replay_on_ray` is the same over Ray actors)."""
    plan = plan_workers(trace, run, options, resume)
    parts_dir = run.dir / ".workers"
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    for k, (rows, opts) in enumerate(zip(plan.shares, plan.options)):
        parent_conn, child_conn = ctx.Pipe()
        proc = ctx.Process(target=_worker, name=f"llmlb-replay-{k}",
                           args=(plan.trace.take(rows), pre, policy, opts, str(parts_dir / str(k)), run.run_id,
                                 child_conn))
        proc.start()
        procs.append(proc)
        conns.append(parent_conn)

    stop = {"signalled": False}

    def forward(signum: int, frame: object) -> None:
        stop["signalled"] = True
        interrupts.note(signum)
        for proc in procs:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGINT)

    saved = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        ready = all(_ready(c) for c in conns)
        t0 = perf_counter() + options.start_delay_s - plan.origin
        for c in conns:
            if ready and not stop["signalled"]:
                c.send(t0)
            else:
                c.close()  # a worker that never hears the origin stops: its rows end up not_sent
        for proc in procs:
            proc.join()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    summary = merge_outcomes(plan, run, [_read_part(parts_dir / str(k)) for k in range(options.workers)],
                             options, t0, pre)
    shutil.rmtree(parts_dir, ignore_errors=True)
    if stop["signalled"] or summary["interrupted"]:
        raise KeyboardInterrupt("replay interrupted")
    return summary


def _ready(conn: Connection[float, str]) -> bool:
    try:
        return conn.recv() == "ready"
    except (EOFError, OSError):
        return False


@dataclass
class WorkerOutcome:
    """What one worker left behind, its times already on the parent's timeline."""

    #: its rows (``None``: none readable)
    requests: pa.Table | None = None
    series: pa.Table | None = None
    #: its replayer's summary (``None``: it never finished, so the run is incomplete)
    summary: RunSummary | None = None
    #: its dispatch lag, seconds per request
    lateness: np.ndarray = field(default_factory=lambda: np.zeros(0))
    interrupted: bool = False
    #: parent time by which a lost worker had stopped: its rows without a result that were due by
    #: then may have been sent, and are written as ``error``/``interrupted`` rather than ``not_sent``
    lost_s: float | None = None


def _read_part(folder: Path) -> WorkerOutcome:
    """A worker process's part folder (what a killed worker managed to write, too)."""
    out = WorkerOutcome()
    if table_files(folder / "requests.parquet"):  # a killed worker's flushed parts are whole files
        try:
            out.requests = read_parts(folder / "requests.parquet", REQUESTS)
        except UserError:
            pass
    if table_files(folder / "series.parquet"):
        try:
            out.series = read_parts(folder / "series.parquet", SERIES)
        except UserError:
            pass
    if (folder / "summary.json").exists():
        info = json.loads((folder / "summary.json").read_text())
        out.summary, out.interrupted = info["summary"], info["interrupted"]
        out.lateness = np.load(folder / "lateness.npy")
    return out


def merge_outcomes(plan: WorkerPlan, run: RunStore, outcomes: list[WorkerOutcome], options: ReplayOptions,
                   t0: float, pre: Preflight) -> ReplayResult:
    """Workers' rows into the run, a row for every trace row no worker wrote, combined figures."""
    written: list[pa.Table] = []
    lateness, cpu, interrupted, loop_kind, scraped = [], 0.0, False, "asyncio", []
    for out in outcomes:
        if out.requests is not None:
            write_table(run.requests, out.requests)
            written.append(out.requests.select(["request_id", "status", "sent_s", "last_token_s"]))
        if out.series is not None:
            write_table(run.series, out.series)
        if out.summary is None:
            interrupted = True
            continue
        interrupted |= out.interrupted
        part = out.summary.get("client", {})
        cpu += part.get("cpu_s", 0.0)
        loop_kind = part.get("event_loop", loop_kind)
        scraped += out.summary.get("replay", {}).get("scraped_metrics", [])
        lateness.append(out.lateness)
    done = pa.concat_tables(written) if written else None
    have = set(done.column("request_id").to_pylist()) if done is not None else set()
    statuses = Counter(plan.carried)
    statuses.update(done.column("status").to_pylist() if done is not None else [])
    rids = plan.trace.column("request_id").to_pylist()
    for rows, out in zip(plan.shares, outcomes):
        missing = [i for i in rows if rids[i] not in have]
        if missing:  # a worker that failed or never started: its rows were not sent by this run
            statuses.update(_write_lost(run, plan.trace.take(missing), options.time_scale, out.lost_s))
    statuses = +statuses  # drop zero counts
    sent = np.asarray(done.column("sent_s").drop_null()) if done is not None else np.zeros(0)
    ends = pc.max(pc.coalesce(done.column("last_token_s"), done.column("sent_s"))).as_py() if done is not None else None
    client = client_summary(np.concatenate(lateness) if lateness else np.zeros(0), cpu, int(sent.size), loop_kind,
                            t0, options.lag_threshold_ms, workers=options.workers)
    replay = replay_summary(statuses, int(sent.size), float(sent.min()) if sent.size else None,
                            float(sent.max()) if sent.size else None, ends, interrupted, pre, scraped)
    if plan.carried:
        replay["resumed"] = {"carried_rows": sum(plan.carried.values())}
    run.summary["client"] = client
    run.summary["replay"] = replay
    return {"client": client, **replay}


def _write_lost(run: RunStore, lost: pa.Table, time_scale: float, lost_s: float | None) -> Counter[str]:
    """Rows for requests a worker left without a result: ``not_sent``, or, when the worker was lost
    after their earliest send time, ``error``/``interrupted`` (they may have been sent; a resume
    sends them again)."""
    scheduled = pc.multiply(lost.column("arrival_s"), time_scale)
    maybe_sent = (pc.less_equal(scheduled, lost_s) if lost_s is not None
                  else pa.array([False] * lost.num_rows))
    status = pc.if_else(maybe_sent, "error", "not_sent")
    run.requests.write({"request_id": lost.column("request_id"), "status": status,
                        "error": pc.if_else(maybe_sent, INTERRUPTED, pa.scalar(None, pa.string())),
                        "scheduled_s": scheduled, "input_tokens": lost.column("input_tokens"),
                        **{c: lost.column(c) for c in ("session_id", "turn") if c in lost.column_names},
                        "requested_output_tokens": lost.column("output_tokens")})
    return Counter(status.to_pylist())
