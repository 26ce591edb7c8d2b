"""Capacity search against real endpoints: the simulator's bisection, each evaluation a timed replay.

A probe at rate ``r`` generates the workload at ``rate_scale = r / nominal``
with the search's one seed (common random numbers: every probe's trace holds
the same requests, compressed in time, exactly as the simulator's search),
replays it open loop against the endpoints with the ordinary replayer, stores
it as an ordinary run (``cap.<workload>.endpoints.<policy>.rate<r>.s<seed>``,
run.json ``config.sweep`` with phase ``capacity``), and judges it with the
sweep's figures. :func:`~llmlb_bench.sweep.capacity.bisect` does the rest,
evaluating the top of the bracket last (only when every midpoint met): the
same answer without the most overloaded probe.

What makes a probe trustworthy:

* **cooldown**: a probe past capacity leaves a queue behind that would slow
  the next probe down. Before every probe but the first the search sleeps
  ``cooldown_s``, then, for endpoints that publish engine gauges on
  ``/metrics`` (vLLM, SGLang, llama.cpp, TGI, ``llmlb serve``), waits until
  none has a running or waiting request (the first probe waits for that too,
  without the sleep); each probe records whether the endpoints were idle;
* **warm-up**: after a cooldown the engine starts empty, so the first
  requests of a probe meet no queue and no batch. The first ``warmup``
  fraction of each probe's requests (by schedule) are sent, loading the
  engine, but not judged;
* **cold prompts**: the replayer makes a prompt's text from the request's id
  and prefix hashes, so the same requests at every rate would be the same
  text, and an endpoint's prefix cache would serve later probes from what
  earlier ones left (the simulator starts every run cold). Each probe's
  request ids and prefix hashes are therefore salted with a hash of the
  search's name and the probe's run id (:func:`fresh_prompts`): new text,
  the same lengths, times and sharing within the probe.

The budget is wall time (``budget_s``) and/or requests sent
(``budget_requests``). Before each probe its cost is known or estimated:
its request count exactly, its time as cooldown + the trace's span + the
longest tail any earlier probe had after its last send (draining, storing,
summarising). A probe that does not fit is not started: the search stops
with the bracket reached, censored ``budget``.

Repeats (:func:`run_repeats`) search once per seed within the one budget,
each seed a different sample of requests, and report the mean capacity with
its Student-t interval, like the simulator's sweep.

A stored probe that finished under the same settings (same run id and cell
key) is reused instead of sent again, so rerunning a search under the same
``name`` resumes it; a fresh name measures afresh.
"""

from __future__ import annotations

import hashlib
import http.client
import math
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Literal, Mapping, TypedDict

import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench import __version__
from llmlb_bench.errors import UserError
from llmlb_bench.experiment import replay_run
from llmlb_bench.replay import Preflight, ReplayOptions, preflight
from llmlb_bench.replay.scrape import parse_metrics
from llmlb_bench.schema import write_trace
from llmlb_bench.store.run import write_json_atomic
from llmlb_bench.sweep.capacity import Bisection, CapacityTask, OutOfBudget, Outcome, bisect, combine
from llmlb_bench.sweep.cells import TRACES, Cell, finished
from llmlb_bench.sweep.figures import compute_figures
from llmlb_bench.sweep.stats import MeanCi
from llmlb_bench.sweep.rates import nominal_rate
from llmlb_bench.workload import WorkloadSpec, generate

SUMMARY = "summary.json"
#: the fleet's label in run ids and coordinates
CLUSTER = "endpoints"
#: seconds between reads of the endpoints' gauges while waiting for them to drain
POLL_S = 0.1
#: longest wait for a drain when no budget bounds it
DRAIN_LIMIT_S = 300.0


class PolicySetting(TypedDict):
    name: str
    args: dict[str, object]


class ProbeLength(TypedDict):
    duration_s: float | None
    requests: int | None


class Budget(TypedDict):
    seconds: float | None
    requests: int | None


class Spent(TypedDict):
    seconds: float
    requests: int


class Settings(TypedDict):
    """A search's settings as summary.json states them (:meth:`EndpointSearch.describe`)."""

    name: str
    workload: str
    workload_source: str
    endpoints: list[str]
    policy: PolicySetting
    slo: str
    target: float
    rate: list[float]               # the bracket searched: [low, high]
    tolerance: float
    probe: ProbeLength
    warmup: float
    cooldown_s: float
    budget: Budget


class Probe(TypedDict):
    """One probe of a search, in the order made: summary.json's ``probes`` and what ``on_probe`` hears."""

    rate: float
    requests: int
    judged_from_s: float
    attainment: float | None
    goodput: float | None
    ttft_p90: float | None
    tpot_p90: float | None
    meets: bool
    run_id: str
    ran: bool                       # false: reused from an earlier run of the same search
    drained: bool | None            # the endpoints' gauges showed no work before it (None: reused)
    wall_s: float | None


class SearchSummary(Settings):
    """One search's summary.json (:func:`run_search`); an open end of its bracket is null."""

    tool_version: str
    seed: int
    root: str
    nominal_rate: float
    models: list[str]
    status: Literal["running", "complete"]
    capacity: float | None
    bracket: list[float | None] | None      # None while running
    censored: str | None
    spent: Spent
    probes: list[Probe]


class SeedSearch(Outcome):
    """One seed's search as :func:`run_repeats` lists it (an open end of its bracket is null)."""

    seed: int
    bracket: list[float | None] | None      # as its summary has it (None only while a search runs)
    probes: int
    requests: int
    summary: str


class RepeatsSummary(Settings, MeanCi):
    """The summary.json of one search per seed (:func:`run_repeats`): the mean capacity over the seeds
    measured, with its interval, and each seed's search."""

    tool_version: str
    repeats: int
    root: str
    status: Literal["complete"]
    censored: list[str]
    not_measured: list[int]
    per_seed: list[SeedSearch]
    spent: Spent


@dataclass
class EndpointSearch:
    """One capacity search against real endpoints: what to send, where, and how it is judged and bounded."""

    name: str
    workload: str                   # label in run ids
    spec: WorkloadSpec              # already cut to one probe's length (duration_s or requests)
    endpoints: list[str]
    slo: str
    target: float
    low: float
    high: float
    tolerance: float = 0.05
    policy: str = "least_outstanding"
    policy_args: Mapping[str, object] = field(default_factory=dict)
    seed: int = 0
    options: ReplayOptions = field(default_factory=ReplayOptions)
    cooldown_s: float = 5.0
    warmup: float = 0.1             # fraction of each probe's requests sent but not judged
    budget_s: float | None = None
    budget_requests: int | None = None

    def task(self) -> CapacityTask:
        """The bisection over cells; a cell's fleet is the endpoint list (and how they are called)."""
        template = Cell(sweep=self.name, phase="capacity", workload=self.workload, cluster=CLUSTER,
                        policy=self.policy, axis="rate", x=0.0, rate_scale=1.0, rate=0.0, seed=self.seed,
                        workload_spec=self.spec.to_dict(), workload_source=self.spec.source,
                        cluster_config={"endpoints": list(self.endpoints), "replay": self.options.describe()},
                        policy_name=self.policy, policy_args=dict(self.policy_args))
        return CapacityTask(template, nominal_rate(self.spec), self.slo, self.target, self.low, self.high,
                            self.tolerance)

    def describe(self) -> Settings:
        """The settings as summary.json states them (the seed apart: one search's, or the first of several)."""
        return {"name": self.name, "workload": self.workload, "workload_source": self.spec.source,
                "endpoints": list(self.endpoints), "policy": {"name": self.policy, "args": dict(self.policy_args)},
                "slo": self.slo, "target": self.target, "rate": [self.low, self.high],
                "tolerance": self.tolerance,
                "probe": {"duration_s": self.spec.duration_s, "requests": self.spec.requests},
                "warmup": self.warmup, "cooldown_s": self.cooldown_s,
                "budget": {"seconds": self.budget_s, "requests": self.budget_requests}}


def _gauges_busy(url: str) -> bool | None:
    """Whether the endpoint's ``/metrics`` shows running or waiting requests; None without such gauges."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=2.0) as resp:
            signals = parse_metrics(resp.read().decode("utf-8", "replace"))
    except (OSError, http.client.HTTPException, ValueError):
        return None
    if signals.running is None and signals.waiting is None:
        return None
    return bool(signals.running or signals.waiting)


def fresh_prompts(table: pa.Table, salt: int) -> pa.Table:
    """``table`` with request ids (and parent ids) shifted and prefix hashes XORed by ``salt``.

    XOR keeps which requests share which leading blocks; one shift of every
    id (a multiple of 2**32, below 2**62) keeps them unique and each parent
    id naming its parent.
    """
    offset = (salt % (1 << 30)) << 32
    for name in ("request_id", "parent_id"):
        col = table.column(name)
        table = table.set_column(table.schema.get_field_index(name), name, pc.add(col, pa.scalar(offset, col.type)))
    hashes = table.column("prefix_hashes").combine_chunks()
    salted = pc.bit_wise_xor(hashes.values, pa.scalar(salt, pa.uint64()))
    rebuilt = pa.ListArray.from_arrays(hashes.offsets, salted, type=hashes.type, mask=hashes.is_null())
    return table.set_column(table.schema.get_field_index("prefix_hashes"), "prefix_hashes", rebuilt)


def _salt(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("/".join(parts).encode()).digest()[:8], "big")


def wait_idle(urls: list[str], deadline: float) -> bool:
    """Poll until no endpoint with engine gauges reports work (True), or ``deadline`` (``perf_counter``) passes."""
    watched = list(urls)
    while True:
        busy = [u for u in watched if _gauges_busy(u)]
        if not busy:
            return True
        if time.perf_counter() >= deadline:
            return False
        watched = busy
        time.sleep(POLL_S)


class _Clock:
    """What the search has spent, and whether the next probe fits in what is left."""

    def __init__(self, search: EndpointSearch) -> None:
        self.search = search
        self.start = time.perf_counter()
        self.requests = 0
        self.tail_s = 0.0       # longest time an earlier probe took past its trace's span

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def deadline(self) -> float:
        s = self.search
        return self.start + s.budget_s if s.budget_s is not None else time.perf_counter() + DRAIN_LIMIT_S

    def check(self, rows: int, span_s: float, pause_s: float) -> None:
        """Raise :class:`OutOfBudget` unless a probe of ``rows`` requests over ``span_s`` fits after ``pause_s``."""
        s = self.search
        if s.budget_requests is not None and self.requests + rows > s.budget_requests:
            raise OutOfBudget
        if s.budget_s is not None and self.elapsed() + pause_s + span_s + self.tail_s > s.budget_s:
            raise OutOfBudget


def _judged_from(trace_arrivals: list[float], warmup: float, time_scale: float) -> float:
    """Schedule time from which requests are judged: the first one after the warm-up fraction."""
    k = math.floor(warmup * len(trace_arrivals))
    return 0.0 if k == 0 else sorted(trace_arrivals)[k] * time_scale


def run_search(search: EndpointSearch, results: str | Path, pre: Preflight | None = None,
               on_probe: Callable[[Probe], None] | None = None) -> SearchSummary:
    """Search ``search``'s capacity into ``results/<name>/``; returns (and writes) the summary.

    ``pre`` is :func:`~llmlb_bench.replay.preflight` of the endpoints when the
    caller already has it (the CLI does, before any folder is made);
    ``on_probe`` hears each probe's record as it is made.
    """
    pre = pre or preflight(search.endpoints, search.options)
    task = search.task()
    # the lowest rate's trace is the shortest prefix of every other (common random numbers)
    if generate(search.spec, seed=search.seed, rate_scale=search.low / task.nominal_rate).num_rows == 0:
        raise UserError(f"a probe at {search.low:g} req/s holds no request; lengthen the probe or raise "
                        "the bracket's low end", search.spec.source)
    root = Path(results) / search.name
    (root / TRACES).mkdir(parents=True, exist_ok=True)
    clock = _Clock(search)
    probes: list[Probe] = []
    scale = search.options.time_scale

    def summary(outcome: Bisection | None) -> SearchSummary:
        """Written after every probe (status ``running``) and at the end (``complete``)."""
        doc: SearchSummary = {
            "tool_version": __version__, **search.describe(), "seed": search.seed, "root": str(root),
            "nominal_rate": task.nominal_rate, "models": pre.models,
            "status": "running" if outcome is None else "complete",
            "capacity": outcome["capacity"] if outcome else None,
            # an open end of the bracket (nothing missed, or nothing met) is null: JSON has no infinity
            "bracket": [b if math.isfinite(b) else None for b in outcome["bracket"]] if outcome else None,
            "censored": outcome["censored"] if outcome else None,
            "spent": {"seconds": clock.elapsed(), "requests": clock.requests}, "probes": probes}
        write_json_atomic(root / SUMMARY, doc)
        return doc

    def meets(rate: float) -> bool:
        cell = task.cell(rate)
        table = fresh_prompts(generate(search.spec, seed=cell.seed, rate_scale=cell.rate_scale),
                              _salt(search.name, cell.run_id))
        arrivals = table.column("arrival_s").to_pylist()
        span = max(arrivals, default=0.0) * scale
        reused = finished(root / cell.run_id, cell.key)
        started = time.perf_counter()
        drained: bool | None = None     # the endpoints' gauges showed no work before it (None: reused)
        if not reused:
            pause = search.cooldown_s if clock.requests else 0.0
            clock.check(table.num_rows, span, pause)
            time.sleep(pause)
            drained = wait_idle(search.endpoints, clock.deadline())
            clock.check(table.num_rows, span, 0.0)   # a slow drain may have eaten the room
            started = time.perf_counter()
            _replay_probe(search, pre, cell, table, root)
            clock.requests += table.num_rows
        since = _judged_from(arrivals, search.warmup, scale)
        figures = compute_figures(root, cell.run_id, cell.key, search.slo, since)
        if not reused:
            clock.tail_s = max(clock.tail_s, time.perf_counter() - started - span)
        record: Probe = {"rate": rate, "requests": table.num_rows, "judged_from_s": since,
                  "attainment": figures["attainment"], "goodput": figures["goodput"],
                  "ttft_p90": figures["ttft.p90"], "tpot_p90": figures["tpot.p90"],
                  "meets": figures["attainment"] is not None and figures["attainment"] >= search.target,
                  "run_id": cell.run_id, "ran": not reused, "drained": drained,
                  "wall_s": None if reused else time.perf_counter() - started}
        probes.append(record)
        summary(None)
        if on_probe is not None:
            on_probe(record)
        return record["meets"]

    return summary(bisect(meets, search.low, search.high, search.tolerance, high_last=True))


def run_repeats(search: EndpointSearch, repeats: int, results: str | Path, pre: Preflight | None = None,
                on_probe: Callable[[Probe], None] | None = None) -> RepeatsSummary:
    """One search per seed (``search.seed``, +1, ...), all within ``search``'s one budget; their mean
    capacity with its Student-t interval, as the simulator's sweep reports it.

    Seed ``k``'s search is an ordinary search named ``<name>-s<k>`` in
    ``results/<name>/`` (so a rerun resumes every one of them), given what
    the earlier seeds left of the budget. A seed whose search could not make
    a single probe within the budget measured nothing and is left out of the
    mean (listed, censored ``budget``); one that stopped on the budget with
    a capacity found counts with it, a lower bound (flagged in ``censored``).
    Writes and returns ``results/<name>/summary.json``.
    """
    pre = pre or preflight(search.endpoints, search.options)
    root = Path(results) / search.name
    start = time.perf_counter()
    requests = 0
    per_seed: list[SeedSearch] = []
    for seed in range(search.seed, search.seed + repeats):
        left_s = None if search.budget_s is None else search.budget_s - (time.perf_counter() - start)
        left_requests = None if search.budget_requests is None else search.budget_requests - requests
        one = replace(search, name=f"{search.name}-s{seed}", seed=seed, budget_s=left_s,
                      budget_requests=left_requests)
        out = run_search(one, root, pre, on_probe)
        requests += out["spent"]["requests"]
        per_seed.append({"seed": seed, "capacity": out["capacity"], "bracket": out["bracket"],
                         "censored": out["censored"], "probes": len(out["probes"]),
                         "requests": out["spent"]["requests"], "summary": str(Path(out["root"]) / SUMMARY)})
    measured = [r for r in per_seed if r["probes"] and not (r["censored"] == "budget" and r["capacity"] is None)]
    over = combine(measured)
    doc: RepeatsSummary = {
        "tool_version": __version__, **search.describe(), "repeats": repeats, "root": str(root),
        "status": "complete", "mean": over["mean"], "low": over["low"], "high": over["high"], "n": over["n"],
        "censored": over["censored"], "not_measured": [r["seed"] for r in per_seed if r not in measured],
        "per_seed": per_seed, "spent": {"seconds": time.perf_counter() - start, "requests": requests}}
    write_json_atomic(root / SUMMARY, doc)
    return doc


def _replay_probe(search: EndpointSearch, pre: Preflight, cell: Cell, table: pa.Table, root: Path) -> None:
    """Replay one probe's trace (kept in ``root/traces/<run id>.parquet``) into ``root/<run id>``, an
    ordinary replay run tagged with its coordinates."""
    trace_path = root / TRACES / f"{cell.run_id}.parquet"
    write_trace(table, trace_path, spec=search.spec.to_dict(), block_size=search.spec.block_size)
    replay_run(table, trace_path, pre, search.policy, search.policy_args, search.seed, root,   # a fresh policy
               replace(search.options, progress=None), run_id=cell.run_id, sweep=cell.coordinates())

