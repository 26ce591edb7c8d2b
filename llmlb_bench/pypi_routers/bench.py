"""Running the router scenario suite: every scenario through every router and directly.

For each scenario and each router (and ``direct``: llmlb's own client-side policy of the same
algorithm, talking to the backends without a router) the bench starts fresh backends (empty
caches) on the scenario's fixed ports, starts the router in front of them, replays the trace as an
ordinary llmlb run (``<out>/<scenario>/<router>/``: requests.parquet with each request's backend,
series.parquet with each backend's queue and KV over time), applies the scenario's kills and
restarts, reads the router process's CPU from ``/proc`` before and after, and reduces the rows to
the figures of docs/routers.md. Backends and routers are stopped on every exit path.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal, TypedDict

import numpy as np
import pyarrow.parquet as pq

from llmlb_bench.metrics.fairness import jain
from llmlb_bench.policies import Policy, make_policy
from llmlb_bench.replay import ReplayOptions, replay
from llmlb_bench.replay.scrape import SeriesRows, parse_metrics
from llmlb_bench.pypi_routers.fleet import Backend
from llmlb_bench.pypi_routers.launch import RouterProcess, free_ports
from llmlb_bench.pypi_routers.scenarios import Scenario, offered_hit_rate
from llmlb_bench.store import RunStore

DIRECT = "direct"


@dataclass
class BenchOptions:
    policy: str = "cache_aware"
    #: SLO per request, from arrival: TTFT and mean time per output token (wall seconds)
    slo_ttft_s: float = 0.5
    slo_tpot_s: float = 0.05
    scrape_s: float = 0.5
    model: str = "llama-3-8b"
    #: cores for the router process (``taskset -c``), e.g. "1"; None: no pinning
    router_cpus: str | None = None
    extra_args: dict[str, list[str]] = field(default_factory=dict)


def error_kind(status: str, error: str | None, http_status: int | None, short: bool) -> str | None:
    """How the client saw a failure: ``timeout``, ``http <status>``, ``in-band error event``,
    ``dropped connection``; ``short stream without usage`` for an ``ok`` stream that ended with
    [DONE] but without usage and with fewer tokens than asked; None for a good request."""
    if status == "ok":
        return "short stream without usage" if short else None
    text = error or ""
    if status == "timeout":
        return "timeout"
    if "server error in stream" in text:
        return "in-band error event"
    if http_status and http_status >= 300:
        return f"http {http_status}"
    return "dropped connection"


class _Scraper(threading.Thread):
    """Each backend's /metrics every ``interval`` seconds into series rows (clock times)."""

    def __init__(self, urls: list[str], interval: float) -> None:
        super().__init__(daemon=True)
        self.urls, self.interval = urls, interval
        self.series = SeriesRows()
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            for url in self.urls:
                try:
                    with urllib.request.urlopen(url + "/metrics", timeout=self.interval) as r:
                        sig = parse_metrics(r.read().decode(errors="replace"))
                except OSError:
                    continue  # a killed backend has no series while it is down
                self.series.add(time.perf_counter(), url, sig)


class _Compared(TypedDict, total=False):
    """Added after the requests file's figures: what the router itself counted (:func:`run_cell`), then, once
    every router of the scenario has run, the agreements and added latencies (``direct`` has no agreements)."""

    router_counted_per_backend: dict[str, float] | None
    agreement_direct: float | None
    colocation_direct: float | None
    agreement_sim: float | None
    colocation_sim: float | None
    added_ttft_p50_s: float | None
    added_ttft_p99_s: float | None
    added_e2e_p50_s: float | None
    added_e2e_p99_s: float | None


class Cell(_Compared):
    """One scenario through one router (or ``direct``): the figures of docs/routers.md."""

    scenario: str
    router: str
    requests: int
    ok: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    cpu_ms_per_request: float | None
    requests_per_backend: dict[str, int]
    jain_backends: float | None
    backend_known: float
    hit_rate_delivered: float
    hit_rate_offered: float
    slo_attainment: float
    goodput_rps: float | None
    errors: dict[str, int]


#: the latency figures whose added part (router minus direct) a cell reports
Latency = Literal["ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s"]


def _direct_policy(name: str) -> Policy:
    try:
        return make_policy(name)
    except Exception:  # a router-only policy name: the direct control routes round robin
        return make_policy("round_robin")


def run_cell(scenario: Scenario, router: str, ports: list[int], out: Path, opt: BenchOptions) -> Cell:
    """One scenario through one router (or ``direct``); returns its figures."""
    fleet = [Backend(p, s, seed=i, model=opt.model) for i, (p, s) in enumerate(zip(ports, scenario.fleet.speeds))]
    urls = [b.url for b in fleet]
    proc: RouterProcess | None = None
    timers: list[threading.Timer] = []
    scraper = _Scraper(urls, opt.scrape_s)
    duration = float(scenario.trace.column("arrival_s").to_numpy().max())
    try:
        for b in fleet:
            b.start(wait=False)
        for b in fleet:
            b.wait_ready()
        if router != DIRECT:
            proc = RouterProcess(router, opt.policy, urls, out / scenario.name / f"{router}.log",
                                 extra=opt.extra_args.get(router), cpus=opt.router_cpus).wait_ready()
        endpoints = [proc.url] if proc else urls
        policy = make_policy("round_robin") if proc else _direct_policy(opt.policy)
        options = ReplayOptions(model=opt.model, scrape_s=None, start_delay_s=0.2)
        config = {"scenario": scenario.name, "router": router, "router_policy": opt.policy,
                  "backends": urls, "speeds": list(scenario.fleet.speeds), "events": list(scenario.fleet.events),
                  "router_argv": proc.argv if proc else None}
        cpu0 = proc.cpu_s() if proc else 0.0
        counted0 = proc.worker_counts() if proc else {}
        # a restart does not wait for readiness: the router's health checks are what is under test
        actions: dict[str, Callable[[Backend], object]] = {"kill": Backend.kill,
                                                        "start": lambda b: b.start(wait=False)}
        for frac, idx, what in scenario.fleet.events:
            timers.append(threading.Timer(options.start_delay_s + frac * duration, actions[what], (fleet[idx],)))
        scraper.start()
        for t in timers:
            t.start()
        with RunStore(out / scenario.name, config=config, backend="replay", run_id=router, label=router) as run:
            summary = replay(scenario.trace, endpoints, policy, run, options)
            scraper.stop_event.set()
            scraper.join()
            t0 = summary.get("client", {}).get("t0_clock_s", 0.0)
            series = scraper.series.take(t0)
            if series:
                run.series.write(series)
        cpu = (proc.cpu_s() - cpu0) if proc else None
        counted = {w: c - counted0.get(w, 0.0) for w, c in proc.worker_counts().items()} if proc else {}
    finally:
        scraper.stop_event.set()
        for t in timers:
            t.cancel()
        if proc is not None:
            proc.stop()
        for b in fleet:
            b.stop()
    fig = figures(scenario, router, out / scenario.name / router / "requests.parquet", urls, cpu, opt)
    fig["router_counted_per_backend"] = counted or None
    return fig


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def figures(scenario: Scenario, router: str, requests: Path, backends: list[str], cpu_s: float | None,
            opt: BenchOptions) -> Cell:
    """The per-cell figures of docs/routers.md from a run's requests file."""
    t = pq.read_table(requests).to_pydict()
    n = len(t["request_id"])
    ok = np.array([s == "ok" for s in t["status"]])
    arrive = np.array(t["scheduled_s"], dtype=float)

    def col(name: str) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in t[name]], dtype=float)

    first, last, out_tok = col("first_token_s"), col("last_token_s"), col("output_tokens")
    ttft, e2e = (first - arrive)[ok], (last - arrive)[ok]
    tpot = np.where(out_tok > 1, (last - first) / np.maximum(out_tok - 1, 1), 0.0)
    good = ok & ((first - arrive) <= opt.slo_ttft_s) & (tpot <= opt.slo_tpot_s)
    kinds: dict[str, int] = {}
    for i in range(n):
        short = bool(t["output_tokens_estimated"][i]) and (t["output_tokens"][i] or 0) < (t["requested_output_tokens"][i] or 0)
        k = error_kind(t["status"][i], t["error"][i], t["http_status"][i], short)
        if k:
            kinds[k] = kinds.get(k, 0) + 1
    per_backend = {b: 0 for b in backends}
    for b in t["backend"]:
        if b is not None:
            per_backend[b] = per_backend.get(b, 0) + 1
    cached, inp = col("cached_tokens")[ok], col("input_tokens")[ok]
    span = float(arrive.max() - arrive.min()) if n else 0.0
    sent = sum(1 for s in t["sent_s"] if s is not None)
    return {
        "scenario": scenario.name, "router": router, "requests": n, "ok": int(ok.sum()),
        "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
        "e2e_p50_s": _pct(e2e, 50), "e2e_p99_s": _pct(e2e, 99),
        "cpu_ms_per_request": None if cpu_s is None or not sent else 1000 * cpu_s / sent,
        "requests_per_backend": per_backend,
        "jain_backends": jain([float(v) for v in per_backend.values()]),
        "backend_known": sum(1 for b in t["backend"] if b is not None) / n if n else 0.0,
        "hit_rate_delivered": float(np.nansum(cached) / np.nansum(inp)) if inp.size and np.nansum(inp) else 0.0,
        "hit_rate_offered": offered_hit_rate(scenario.trace),
        "slo_attainment": float(good.sum() / n) if n else 0.0,
        "goodput_rps": float(good.sum() / span) if span else None,
        "errors": kinds,
    }


def run_suite(scenarios: list[Scenario], routers: list[str], out: Path, opt: BenchOptions,
              progress: Callable[[str], None] = print) -> list[Cell]:
    """Every scenario through ``direct`` and every router; figures also to ``<out>/figures.json``."""
    cells: list[Cell] = []
    for sc in scenarios:
        ports = free_ports(len(sc.fleet.speeds))
        mine = []
        for router in [DIRECT, *routers]:
            progress(f"{sc.name} / {router} ...")
            mine.append(run_cell(sc, router, ports, out, opt))
        # decision-level fidelity: each router against llmlb's policy of the same name, replayed
        # (the direct run, same backends and URLs) and simulated
        placed = {c["router"]: decisions(out / sc.name / c["router"] / "requests.parquet") for c in mine}
        sim = simulate_decisions(sc, opt.policy, [f"http://127.0.0.1:{p}" for p in ports], out)
        for c in mine:
            if c["router"] != DIRECT:
                direct, simulated = agreement(placed[c["router"]], placed[DIRECT]), agreement(placed[c["router"]], sim)
                c["agreement_direct"], c["colocation_direct"] = direct["same"], direct["colocation"]
                c["agreement_sim"], c["colocation_sim"] = simulated["same"], simulated["colocation"]
        cells += mine
    added(cells)
    (out / "figures.json").write_text(json.dumps(cells, indent=1) + "\n")
    return cells


def decisions(path: Path, names: dict[str, str] | None = None) -> dict[int, str]:
    """request_id -> backend of a run; a simulated run's replica names are mapped through ``names``
    (replica ``r{i}`` stands for backend ``i``)."""
    t = pq.read_table(path, columns=["request_id", "backend", "target"]).to_pydict()
    out = {}
    for rid, backend, target in zip(t["request_id"], t["backend"], t["target"]):
        b = backend if backend is not None else (names or {}).get(target) if target is not None else None
        if b is not None:
            out[rid] = b
    return out


def agreement(x: dict[int, str], y: dict[int, str]) -> dict[str, float | None]:
    """``same``: the share of requests both runs placed that went to the same backend (decision
    agreement); ``colocation``: the Rand index of the two placements — the share of request pairs
    both put together or both apart — which does not care which backend got which group (an
    identical partition under swapped backend labels scores 1)."""
    both = [k for k in x if k in y]
    if not both:
        return {"same": None, "colocation": None}
    same = sum(x[k] == y[k] for k in both) / len(both)
    n = len(both)
    cont: dict[tuple[str, str], int] = {}
    for k in both:
        cont[(x[k], y[k])] = cont.get((x[k], y[k]), 0) + 1

    def pairs(counts: Iterable[int]) -> float:
        return float(sum(c * (c - 1) / 2 for c in counts))
    a_pairs = pairs(_margin(cont, 0).values())
    b_pairs = pairs(_margin(cont, 1).values())
    together = pairs(cont.values())
    total = n * (n - 1) / 2
    rand = (total + 2 * together - a_pairs - b_pairs) / total if total else 1.0
    return {"same": same, "colocation": rand}


def _margin(cont: dict[tuple[str, str], int], side: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, c in cont.items():
        out[key[side]] = out.get(key[side], 0) + c
    return out


def simulate_decisions(scenario: Scenario, policy: str, urls: list[str], out: Path) -> dict[int, str]:
    """The same trace through llmlb's simulator under llmlb's policy of that name (replicas of
    the backends' model; ``r{i}`` = backend ``i``)."""
    from llmlb_bench.sim import ClusterConfig, simulate

    cfg = ClusterConfig.build(replicas=len(urls))
    with RunStore(out / scenario.name, config={"cluster": cfg.to_dict()}, backend="sim", run_id="sim",
                  label="sim") as run:
        simulate(scenario.trace, cfg, _direct_policy(policy), run, seed=0)
    return decisions(run.dir / "requests.parquet", {f"r{i}": u for i, u in enumerate(urls)})


def added(cells: list[Cell]) -> None:
    """Each router cell's added latency: its percentile minus the direct run's, same scenario."""
    direct = {c["scenario"]: c for c in cells if c["router"] == DIRECT}

    def minus(c: Cell, d: Cell | None, key: Latency) -> float | None:
        mine, theirs = c[key], d[key] if d is not None else None
        return None if mine is None or theirs is None or c["router"] == DIRECT else mine - theirs

    for c in cells:
        d = direct.get(c["scenario"])
        c["added_ttft_p50_s"] = minus(c, d, "ttft_p50_s")
        c["added_ttft_p99_s"] = minus(c, d, "ttft_p99_s")
        c["added_e2e_p50_s"] = minus(c, d, "e2e_p50_s")
        c["added_e2e_p99_s"] = minus(c, d, "e2e_p99_s")
