"""Sim-to-real fidelity as distributions: the calibrated simulator against real vLLM CPU replicas.

A real engine does not repeat itself (the same trace replayed three times against one replica
differed by up to 34% in TTFT p50 on a quiet machine), so one replay against one simulation
shows nothing at the 5% level. Every cell here is repeated on both sides and compared as
``llmlb validate`` compares (llmlb_bench/validate.py): bias = median simulated / median real - 1
with a bootstrap interval, each side's spread (CV over its repeats), per-request E2E MAPE.

1. writes the tiny random-weight model, starts one vLLM CPU replica pinned to core 1 (this
   client on core 0), warms it up and calibrates it (``llmlb calibrate``: the typical step and
   its spread); ``--calibrations`` C > 1 calibrates it again after rounds spread evenly over the
   cells (the last after the last round), because one calibration is one draw of the engine's
   speed drift (the base step moved 2.2x between three calibrations minutes apart), so a model
   term is judged on every calibration and on all of them pooled;
2. measures the replica's capacity for each trace shape (closed loop, more users than seats);
3. **cells** (shape x load: Poisson, Gamma CV 3 and shared-prefix multi-turn at 30/60/90% of
   capacity): ``--repeats`` K >= 5 real replays of each, INTERLEAVED (round k replays every cell
   once, in a shuffled order, so a slow spell of the machine spreads over cells instead of
   sinking one), each after ``--anchor-per-slot`` reference probes (calibrate/anchor.py: the
   calibration's drift reference probe, sent all through the run, and once more after the last
   replay). After the replays every calibration's profile is ANCHORED to the probes' long-run
   median (its step model and ``frontend_cpu_s``, the frontend's CPU per request taken from the
   steps, rescaled; its drift the one the probes measured over minutes) and every cell simulated
   with each calibration's profile as calibrated, anchored, anchored with ``frontend_cpu_s`` as
   calibrated, anchored with the term read without each interference pair's control (the
   estimate before 2026-12-02), and anchored without the probes' slow phases (a diagnosis: what
   they cost here; ``--keep`` and benchmarks/replay_steps.py compare the replays' steps with the
   simulated ones'), against the same real replays: per cell and figure the bias, its
   interval, both spreads and the aims' verdict, per calibration and pooled. ``--sim-seeds``
   seeds per cell and profile, by default 30 for a profile with a drift (more seeds than replays:
   a slow drift draws about one replica speed per seed; llmlb_bench.validate.default_sim_seeds);
4. ``llmlb serve --profile`` replaying the 60% Poisson trace K times against the K vLLM replays
   of that cell (the simulator in real time over HTTP);
5. a tiny KV cache (``--num-gpu-blocks-override``): preemptions, real against simulated;
6. the policy ranking over two replicas (one core each) on the multi-turn trace: K real runs of
   each policy interleaved, K seeds simulated; goodput within an SLO DERIVED FROM THE MEASURED
   UNLOADED LATENCY (``SLO_FACTOR`` x the median TTFT and TPOT of the trace's first requests sent
   one at a time), and TTFT p99. A pair of policies counts as RESOLVED on a figure when all its
   real repeats of one lie on the same side of all of the other's; the simulator is judged on
   the resolved pairs only (same order, or not).

Every figure is printed and written as JSON (``--out``); docs/fidelity-runs.md keeps runs with
their command, date and load average. Stages can be skipped (``--skip``) and the cells cut
(``--shapes``, ``--loads``) for a bounded run on a busy machine.

    flock /tmp/llmlb-measure.lock .venv/bin/python benchmarks/fidelity.py --out fidelity.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.calibrate import calibrate
from llmlb_bench.calibrate.anchor import PROBES_PER_SLOT, AnchorProbe, anchored
from llmlb_bench.engines.tiny_hf import word_token_ids
from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, replay
from llmlb_bench.schema import read_trace, trace_table, write_trace
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.sim.profile import ProfileDoc
from llmlb_bench.store import RunStore
from llmlb_bench.store.run import host_info
from llmlb_bench.sweep.endpoint_capacity import fresh_prompts
from llmlb_bench.validate import FIGURES, compare, default_sim_seeds, latencies
from llmlb_bench.workload import WorkloadSpec, generate

ROOT = Path(__file__).resolve().parents[1]
SEQS, BUDGET, BLOCK = 16, 512, 128
LOADS = (0.3, 0.6, 0.9)
POLICIES = ("random", "least_outstanding", "cache_aware")
#: the policy stage's SLO: this many times the measured unloaded TTFT and TPOT
SLO_FACTOR = 3.0

LENGTHS = {"input": {"dist": "lognormal", "median": 200, "sigma": 0.8, "max": 1500},
           "output": {"dist": "lognormal", "median": 48, "sigma": 0.6, "max": 256}}
SHAPES: dict[str, dict[str, Any]] = {
    "poisson": {"arrival": {"process": "poisson", "rate": 1.0}, **LENGTHS},
    "gamma-cv3": {"arrival": {"process": "gamma", "rate": 1.0, "cv": 3.0}, **LENGTHS},
    "multiturn": {"arrival": {"process": "poisson", "rate": 0.25},
                  "input": {"dist": "lognormal", "median": 60, "sigma": 1.2, "max": 1200},
                  "output": {"dist": "lognormal", "median": 40, "sigma": 1.0, "max": 256},
                  "max_context": 3000,
                  "sessions": {"turns": {"dist": "zipf", "s": 1.5, "n": 8},
                               "think_s": {"dist": "lognormal", "median": 1.0, "sigma": 0.5}},
                  "system_prompt": {"groups": 6, "popularity": 1.0,
                                    "tokens": {"dist": "uniform", "low": 256, "high": 768}}},
}


def spec(shape: str, requests: int) -> WorkloadSpec:
    return WorkloadSpec.from_dict({"name": shape, "seed": 7, "requests": requests, "block_size": BLOCK,
                                   "tenants": {"t": {"kind": "chat", **SHAPES[shape]}}}, f"fidelity:{shape}")


def trace_at(shape: str, rate: float, requests: int) -> pa.Table:
    """The shape's trace at ``rate`` requests/s (sessions: their start rate scaled the same way)."""
    s = spec(shape, requests)
    nominal = generate(s, seed=7)
    span = float(np.max(nominal.column("arrival_s").to_numpy())) or 1.0
    return generate(s, seed=7, rate_scale=rate / (nominal.num_rows / span))


class Bench:
    """Replays and simulations of salted copies of traces (fresh prompt text per replay: the
    engine's prefix cache must not serve one replay from another's prompts; the simulator starts
    cold). ``sim`` of the copy a replay used matches its request ids, for the per-request MAPE."""

    def __init__(self, work: Path, extra_body: dict[str, Any]) -> None:
        self.work = work
        self.n = 0
        #: every replay's further body fields: the tiny model's answers kept to whole words
        #: (engines.tiny_hf.word_token_ids), so that multi-turn replays, which send each answer
        #: back in the next turn (replay.threads), can reuse its KV as with a real model's text
        self.extra_body = extra_body
        #: where a single replica's API server and engine-core process run (None: on its core)
        self.frontend: list[list[int]] | None = None

    def salted(self, table: pa.Table) -> tuple[pa.Table, Path]:
        self.n += 1
        path = self.work / "traces" / f"{self.n:04d}.parquet"
        write_trace(fresh_prompts(table, 0x9E3779B97F4A7C15 * self.n % (1 << 62)), path, block_size=BLOCK)
        return read_trace(path), path

    def replay(self, table: pa.Table, path: Path, urls: list[str], policy: str = "round_robin",
               users: int | None = None) -> list[dict]:
        opts = ReplayOptions(api="completions", tokenize=True, users=users, extra_body=self.extra_body)
        store = RunStore(self.work / "runs", config={}, backend="replay", run_id=f"{path.stem}-real-{policy}",
                         trace_path=path, trace_rows=table.num_rows)
        with store:
            replay(table, urls, make_policy(policy, {}, seed=0), store, opts)
        return pq.read_table(store.dir / "requests.parquet").to_pylist()

    def simulate(self, table: pa.Table, path: Path, cfg: ClusterConfig, seed: int,
                 policy: str = "round_robin", label: str = "sim") -> list[dict]:
        store = RunStore(self.work / "runs", config={"cluster": cfg.to_dict()}, backend="sim",
                         run_id=f"{path.stem}-{label}-{policy}-{seed}", trace_path=path, trace_rows=table.num_rows)
        with store:
            simulate(table, cfg, make_policy(policy, {}, seed=seed), store, seed=seed)
        return pq.read_table(store.dir / "requests.parquet").to_pylist()


def capacity(bench: Bench, url: str, shape: str) -> float:
    """Completed requests per second at saturation: closed loop with twice as many users as seats."""
    table, path = bench.salted(trace_at(shape, 1.0, 96))
    rows = bench.replay(table, path, [url], users=2 * SEQS)
    ok = [r for r in rows if r["status"] == "ok"]
    return len(ok) / (max(r["last_token_s"] for r in ok) - min(r["sent_s"] for r in ok))


def summarise(real: list[list[dict]], sim: list[list[dict]]) -> dict[str, Any]:
    c = compare(real, sim)
    d = c.to_dict()
    d["ok"] = {"real": [sum(r["status"] == "ok" for r in run) for run in real],
               "sim": [sum(r["status"] == "ok" for r in run) for run in sim]}
    d["cached_per_request"] = {"real": [sum(r["cached_tokens"] or 0 for r in run) / max(1, len(run)) for run in real],
                               "sim": [sum(r["cached_tokens"] or 0 for r in run) / max(1, len(run)) for run in sim]}
    return d


def cell_line(label: str, d: dict[str, Any]) -> str:
    cells = [f"{label:<18}"]
    for name in FIGURES[:6]:
        f = d["figures"].get(name)
        cells.append(f"{100 * f['bias']:+6.1f} [{100 * f['bias_interval'][0]:+.0f},{100 * f['bias_interval'][1]:+.0f}] "
                     f"{100 * f['real_spread']:4.1f}/{100 * f['sim_spread']:4.1f}" if f else "n/a")
    m = d["e2e_mape_median"]
    cells.append(f"{100 * m:5.1f}" if m is not None else "  n/a")
    cells.append("ok" if not d["failures"] else f"{len(d['failures'])} misses")
    return " | ".join(cells)


HEADER = ("cell               | " + " | ".join(f"{n} bias% [95%] spread% real/sim" for n in FIGURES[:6])
          + " | E2E MAPE% | aims")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the work folder here (a new folder): every replay's and simulation's run with its "
                    "token times (runs/), the traces, the calibrations' probe runs, for reading afterwards, e.g. "
                    "the engine's steps in the replays (benchmarks/replay_steps.py)")
    ap.add_argument("--requests", type=int, default=150, help="requests per cell trace")
    ap.add_argument("--repeats", type=int, default=5, help="real replays per cell (K >= 2; the published method "
                    "uses 5 or more)")
    ap.add_argument("--sim-seeds", type=int, default=None,
                    help="simulator seeds per cell and profile (seed j simulates replay j mod K's copy). Default: "
                    "30 for a profile with a speed drift (drift_sigma > 0: every anchored one), else --repeats: "
                    "a drift as slow as a replay draws about one replica speed per seed, and the median of five "
                    "such draws is no estimate of the model's median (seeds 1-5 put the anchored figures +39%%; "
                    "llmlb_bench.validate.default_sim_seeds, docs/fidelity.md)")
    ap.add_argument("--shapes", default="", help="comma-separated trace shapes (default all: " + ", ".join(SHAPES) + ")")
    ap.add_argument("--loads", default="", help="comma-separated loads as fractions of capacity (default 0.3,0.6,0.9)")
    ap.add_argument("--skip", default="", help="comma-separated stages to skip: serve, tiny_kv, policies")
    ap.add_argument("--seed", type=int, default=0, help="the interleaving order's and the simulator's seeds")
    ap.add_argument("--calibrate-repeats", type=int, default=3,
                    help="repeats of every calibration probe (more repeats spread the probes over a longer time, "
                    "so the median step sees more of the engine's slow spells)")
    ap.add_argument("--calibrate-interference-pairs", type=int, default=None,
                    help="interference pairs of every calibration (calibrate's --interference-pairs; default: "
                    "as llmlb calibrate)")
    ap.add_argument("--no-mixed", action="store_true",
                    help="calibrate without the mixed-step probe (calibrate's --no-mixed), for comparison")
    ap.add_argument("--warm-up-replays", type=int, default=0,
                    help="Poisson replays (--requests requests at --warm-up-rate) sent before calibrating: the "
                    "engine's first minutes are faster than its later ones (docs/fidelity-runs.md)")
    ap.add_argument("--warm-up-rate", type=float, default=15.0, help="the warm-up replays' rate, requests/s")
    ap.add_argument("--frontend-core", type=int, default=None,
                    help="run the replica's API server and engine-core process on this core (default: all three "
                    "vLLM processes on the engine's core 1; 0 shares the client's core). The policy stage's two "
                    "replicas keep one core each")
    ap.add_argument("--calibrations", type=int, default=1,
                    help="calibrations of the replica: the first before the cells, the others after rounds spread "
                    "evenly over them, the last after the last round (at most --repeats + 1); every cell is "
                    "simulated with each, and with all of them pooled, so a model term is judged on more than one "
                    "draw of the calibration")
    ap.add_argument("--anchor-per-slot", type=int, default=PROBES_PER_SLOT,
                    help="reference probes sent back to back before every real replay and after the last "
                    "(calibrate/anchor.py: their long-run median rescales every calibration's step model)")
    args = ap.parse_args()
    if args.repeats < 2:
        ap.error("--repeats: at least 2 (a spread needs two)")
    if args.sim_seeds is not None and args.sim_seeds < 2:
        ap.error("--sim-seeds: at least 2 (a spread needs two)")
    if not 1 <= args.calibrations <= args.repeats + 1:
        ap.error("--calibrations: from 1 to --repeats + 1")
    if args.anchor_per_slot < 1:
        ap.error("--anchor-per-slot: at least 1")
    if args.keep is not None and args.keep.exists():
        ap.error(f"--keep: {args.keep} exists; name a new folder")
    skip = set(filter(None, args.skip.split(",")))
    wanted = set(filter(None, args.shapes.split(",")))
    if wanted - set(SHAPES):
        ap.error(f"--shapes: choose from {', '.join(SHAPES)}")
    shapes = [s for s in SHAPES if s in wanted] if wanted else list(SHAPES)
    loads = tuple(float(v) for v in args.loads.split(",")) if args.loads else LOADS
    k_rep = args.repeats

    def save() -> None:         # after every stage, so a later failure keeps what was measured
        if args.out:
            args.out.write_text(json.dumps(out, indent=1))
    os.sched_setaffinity(0, {0})            # the client on core 0, the engine on core 1
    started = time.time()
    out: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "argv": sys.argv[1:],
                           "load_average_start": os.getloadavg(), "host": host_info(), "repeats": k_rep,
                           "settings": {"max_num_seqs": SEQS, "max_num_batched_tokens": BUDGET}}
    if args.keep is not None:
        args.keep.mkdir(parents=True)
    with (contextlib.nullcontext(str(args.keep)) if args.keep is not None
          else tempfile.TemporaryDirectory(prefix="llmlb-fidelity-")) as tmp:
        work = Path(tmp)
        model = write_tiny_model(work / "tiny")
        bench = Bench(work, {"allowed_token_ids": word_token_ids(model)})
        bench.frontend = [[args.frontend_core]] if args.frontend_core is not None else None
        settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)
        with VllmReplicas(model, 1, cores=[1], frontend_cores=bench.frontend, settings=settings) as reps:
            url = reps.urls[0]
            for _ in range(args.warm_up_replays):
                bench.replay(*bench.salted(trace_at("poisson", args.warm_up_rate, args.requests)), [url])
            # the calibration's and the anchor's probes ask what the replays ask (whole-word answers):
            # a random model's partial UTF-8 tokens give the frontend detokenising work the replays
            # do not have, and the frontend's turns are the probes' slow steps (docs/fidelity-runs.md)
            options = ReplayOptions(api="completions", tokenize=True, extra_body=bench.extra_body)

            def calibrated(n: int) -> ProfileDoc:
                """Calibration ``n``, printed and kept in ``out``."""
                t = time.time()
                prof = calibrate(url, {"max_num_seqs": SEQS, "max_num_batched_tokens": BUDGET}, options=options,
                                 max_prompt=2 * BUDGET, repeats=args.calibrate_repeats, seed=args.seed + n,
                                 interference_pairs=args.calibrate_interference_pairs, mixed=not args.no_mixed,
                                 results=work / f"calibration-{n + 1}" if args.keep is not None else None).profile
                out["calibrations"].append({
                    "seconds": time.time() - t, "load_average": os.getloadavg(), "engine": prof["engine"],
                    "step": prof["step"],
                    "request_overhead_s": prof["request_overhead_s"], "frontend_cpu_s": prof["frontend_cpu_s"],
                    "request_per_prompt_token_s": prof["request_per_prompt_token_s"], "jitter": prof["jitter"],
                    "reference": prof.get("reference"), "frontend_wait_share": prof.get("frontend_wait_share"),
                    "frontend_wait": prof["fit"].get("frontend_wait"), "frontend_cpu": prof["fit"].get("frontend_cpu"),
                    "fit": prof["fit"]["by_probe"]})
                print(f"calibration {n + 1} in {time.time() - t:.0f} s: {prof['step']}, overhead "
                      f"{1e3 * prof['request_overhead_s']:.2f} ms + {1e6 * prof['request_per_prompt_token_s']:.2f} "
                      f"us/prompt token, of which {1e3 * prof['frontend_cpu_s']:.2f} ms per request from the steps "
                      f"({prof['fit'].get('frontend_cpu')}); "
                      f"arrivals' wait share {prof['fit'].get('frontend_wait')}; jitter {prof['jitter']}; "
                      f"reference {prof.get('reference')}; fit {prof['fit']['by_probe']}",
                      flush=True)
                return prof
            out["calibrations"] = []
            profiles = [calibrated(0)]
            # the other calibrations after rounds spread evenly over the run, the last after the last round
            recal = {round(j * k_rep / (args.calibrations - 1)): j for j in range(1, args.calibrations)}
            probe = AnchorProbe(url, profiles[0], options, work / "anchor", args.anchor_per_slot, args.seed)
            out["capacity"] = {s: capacity(bench, url, s) for s in shapes}
            print(f"capacity (req/s): {out['capacity']}", flush=True)
            save()
            cells = [(s, load) for s in shapes for load in loads]
            traces = {c: trace_at(c[0], c[1] * out["capacity"][c[0]], args.requests) for c in cells}
            real: dict[tuple[str, float], list[list[dict]]] = {c: [] for c in cells}
            copies: dict[tuple[str, float], list[tuple[pa.Table, Path]]] = {c: [] for c in cells}
            order = random.Random(args.seed)
            for k in range(k_rep):                      # round k: every cell once, in a shuffled order
                round_cells = list(cells)
                order.shuffle(round_cells)
                for c in round_cells:
                    probe.slot()                        # the reference probe between every two replays
                    copies[c].append(bench.salted(traces[c]))
                    real[c].append(bench.replay(*copies[c][-1], [url]))
                print(f"round {k + 1}/{k_rep} done, load average {os.getloadavg()[0]:.2f}", flush=True)
                if k + 1 in recal:
                    profiles.append(calibrated(recal[k + 1]))
            probe.slot()
            out["traces"] = {f"{c[0]} {c[1]}": [path.stem for _, path in copies[c]] for c in cells}
            samples = probe.samples()
            anchoreds = [anchored(prof, samples) for prof in profiles]
            out["anchor"] = {"probes": len(samples), "per_slot": args.anchor_per_slot,
                             "windows": [{"at_s": round(x.at_s, 2), "step_ms": round(1e3 * math.exp(x.log_step), 4)}
                                         for x in samples],
                             "profiles": [{"anchor": a["anchor"], "step": a["step"], "jitter": a["jitter"]}
                                          for a in anchoreds]}
            for n, a in enumerate(anchoreds):
                print(f"calibration {n + 1} anchored: {a['anchor']}; base step {1e3 * profiles[n]['step']['base_s']:.3f}"
                      f" -> {1e3 * a['step']['base_s']:.3f} ms; drift {a['jitter']}", flush=True)
            save()
            # every calibration's profile as calibrated, anchored (its step model and frontend_cpu_s rescaled to
            # the long-run speed), anchored with frontend_cpu_s as calibrated (not rescaled) and anchored with the
            # term read without each interference pair's control (calibrate/fit.py; the estimate before
            # 2026-12-02, not rescaled: the anchored profile of the earlier runs), simulated against the same
            # real replays under the same seeds
            def with_frontend(a: ProfileDoc, value_s: float) -> ProfileDoc:
                return {**a, "frontend_cpu_s": value_s}

            def without_slow_phases(a: ProfileDoc) -> ProfileDoc:
                jitter = a.get("jitter")
                return {**a, "jitter": {**jitter, "slow_rate_hz": 0.0}} if jitter else a

            variants: dict[str, list[ProfileDoc]] = {"calibrated": profiles, "anchored": anchoreds,
                        "anchored_frontend_as_calibrated": [with_frontend(a, p["frontend_cpu_s"])
                                                            for a, p in zip(anchoreds, profiles)],
                        "anchored_frontend_without_control": [
                            with_frontend(a, 1e-3 * p["fit"]["frontend_cpu"]["without_control_ms"])
                            if "frontend_cpu" in p["fit"] else a for a, p in zip(anchoreds, profiles)],
                        # a diagnosis, not a model: what the probes' slow phases cost on these cells
                        "anchored_without_slow_phases": [without_slow_phases(a) for a in anchoreds]}
            sims: dict[str, list[dict[tuple[str, float], list[list[dict]]]]] = {}
            out["sim_seeds"] = {}
            t_sim = time.time()
            for name, profs in variants.items():
                sims[name] = []
                out["sim_seeds"][name] = []
                for n, prof in enumerate(profs):
                    cfg = ClusterConfig.build(replicas=1).with_profile(prof)
                    seeds = args.sim_seeds if args.sim_seeds is not None else default_sim_seeds(prof, k_rep)
                    out["sim_seeds"][name].append(seeds)
                    sims[name].append({c: [bench.simulate(copies[c][j % k_rep][0], copies[c][j % k_rep][1], cfg,
                                                          seed=args.seed + j, label=f"{name}-{n}")
                                           for j in range(seeds)] for c in cells})
            out["simulation_seconds"] = time.time() - t_sim
            for name in variants:
                out[f"cells_{name}"] = {}
                for n in [*range(len(profiles)), None]:       # each calibration, then all of them pooled
                    label = f"calibration {n + 1}" if n is not None else "pooled"
                    rows = []
                    print(f"simulated, {name} profile of {label}:\n{HEADER}")
                    for c in cells:
                        pooled = sims[name][n][c] if n is not None else [r for one in sims[name] for r in one[c]]
                        d = summarise(real[c], pooled)
                        d.update(shape=c[0], load=c[1], rate=c[1] * out["capacity"][c[0]])
                        rows.append(d)
                        print(cell_line(f"{c[0]} {int(c[1] * 100)}%", d), flush=True)
                    out[f"cells_{name}"][label] = rows
            save()
            profile = anchoreds[0]
            serve_cell = ("poisson", 0.6) if ("poisson", 0.6) in real else cells[0]
        stages = [(name, fn) for name, fn in (
            ("serve", lambda: serve_stage(bench, work, profile, traces[serve_cell], real[serve_cell])),
            ("tiny_kv", lambda: tiny_kv(bench, model, profile)),
            ("policies", lambda: policy_ranking(bench, model, profile, out["capacity"].get("multiturn")
                                                or capacity_of_multiturn(bench, model), k_rep, args.seed)))
            if name not in skip]
        for name, fn in stages:
            try:
                out[name] = fn()
            except Exception as exc:        # keep the other stages' figures; say what failed
                out[name] = {"error": repr(exc)}
            print(f"{name}: {json.dumps(out[name])[:2000]}", flush=True)
            save()
    out["seconds"] = time.time() - started
    out["load_average_end"] = os.getloadavg()
    print(f"done in {out['seconds']:.0f} s; load average {out['load_average_start']} -> {out['load_average_end']}")
    save()


def capacity_of_multiturn(bench: Bench, model: Path) -> float:
    settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)
    with VllmReplicas(model, 1, cores=[1], frontend_cores=bench.frontend, settings=settings) as reps:
        return capacity(bench, reps.urls[0], "multiturn")


def serve_stage(bench: Bench, work: Path, profile: dict[str, Any], trace: pa.Table,
                real: list[list[dict]]) -> dict[str, Any]:
    """``llmlb serve --profile`` (pinned to core 1) replaying the cell's trace as many times as vLLM
    did: bias and spreads of llmlb serve against vLLM."""
    prof_path = work / "profile.json"
    prof_path.write_text(json.dumps(profile))
    proc = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-m", "llmlb_bench", "serve", "--profile",
                             str(prof_path), "--replicas", "1", "--port", "0", "--served-model-name", "tiny"],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    try:
        assert proc.stdout is not None
        url = next(line.split()[1] for line in proc.stdout if " http://" in line)
        served = []
        for _ in real:
            table, path = bench.salted(trace)
            served.append(bench.replay(table, path, [url]))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    d = summarise(real, served)
    print(cell_line("serve vs vLLM", d), flush=True)
    return d


def tiny_kv(bench: Bench, model: Path, profile: dict[str, Any]) -> dict[str, Any]:
    """A burst of 24 requests of 256 + 256 tokens on 40 KV blocks of 128 (5,120 tokens): preemptions."""
    blocks = 40
    trace = trace_table(np.zeros(24), 256, 256, "tiny-kv")
    small = {**profile, "engine": {**profile["engine"], "num_kv_blocks": blocks}}
    settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET, num_gpu_blocks=blocks)
    table, path = bench.salted(trace)
    with VllmReplicas(model, 1, cores=[1], frontend_cores=bench.frontend, settings=settings) as reps:
        before = metric_total(reps.urls[0], "vllm:num_preemptions_total")
        real = bench.replay(table, path, reps.urls)
        real_preempt = metric_total(reps.urls[0], "vllm:num_preemptions_total") - before
    sim = bench.simulate(table, path, ClusterConfig.build(replicas=1).with_profile(small), seed=0)
    return {"blocks": blocks, "preemptions_real": real_preempt,
            "preemptions_sim": sum(r["preemptions"] or 0 for r in sim),
            "ok": {"real": sum(r["status"] == "ok" for r in real), "sim": sum(r["status"] == "ok" for r in sim)}}


def metric_total(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{") or
               line.startswith(name + " "))


def unloaded_slo(bench: Bench, trace: pa.Table, urls: list[str]) -> dict[str, float]:
    """The SLO from the measured unloaded latency: the trace's first 16 requests sent one at a time
    to the first replica (threaded turns keep their prompts); SLO_FACTOR x their median TTFT and TPOT."""
    table, path = bench.salted(trace.slice(0, min(16, trace.num_rows)))
    lat = latencies(bench.replay(table, path, urls[:1], users=1))
    return {"ttft_s": SLO_FACTOR * float(np.median(lat["ttft"])), "tpot_s": SLO_FACTOR * float(np.median(lat["tpot"])),
            "unloaded_ttft_p50_s": float(np.median(lat["ttft"])), "unloaded_tpot_p50_s": float(np.median(lat["tpot"]))}


def goodput(rows: list[dict], span: float, slo: dict[str, float]) -> float:
    """Requests per second that met the SLO's TTFT and TPOT."""
    good = 0
    for r in rows:
        if r["status"] != "ok" or r["first_token_s"] is None:
            continue
        ttft = r["first_token_s"] - r["sent_s"]
        tpot = ((r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)) if r["output_tokens"] > 1 else 0
        good += ttft <= slo["ttft_s"] and tpot <= slo["tpot_s"]
    return good / span


def ranking(values: dict[str, dict[str, list[float]]], higher_better: bool) -> dict[str, Any]:
    """Pairs of policies the real repeats resolve (every repeat of one on the same side of every
    repeat of the other), and whether the simulator's medians order each such pair the same way."""
    pairs = []
    for a, b in combinations(values, 2):
        ra, rb = values[a]["real"], values[b]["real"]
        if min(ra) > max(rb) or max(ra) < min(rb):
            real_a_better = bool(np.median(ra) > np.median(rb)) == higher_better
            sa, sb = float(np.median(values[a]["sim"])), float(np.median(values[b]["sim"]))
            sim_a_better = (sa > sb) == higher_better if sa != sb else None
            pairs.append({"better": a if real_a_better else b, "worse": b if real_a_better else a,
                          "sim_agrees": bool(sim_a_better == real_a_better)})
    return {"resolved_pairs": pairs, "agree": all(p["sim_agrees"] for p in pairs) if pairs else None}


def policy_ranking(bench: Bench, model: Path, profile: dict[str, Any], cap1: float, k_rep: int,
                   seed: int) -> dict[str, Any]:
    """Three policies over two replicas (cores 0 and 1) on the multi-turn shared-prefix trace at
    about 70% of two replicas' capacity: K real runs of each (interleaved across policies) and K
    simulator seeds."""
    trace = trace_at("multiturn", 0.7 * 2 * cap1, 200)
    span = float(np.max(trace.column("arrival_s").to_numpy()))
    cfg = ClusterConfig.build(replicas=2).with_profile(profile)
    settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)
    runs: dict[str, dict[str, list[list[dict]]]] = {p: {"real": [], "sim": []} for p in POLICIES}
    order = random.Random(seed + 1)
    with VllmReplicas(model, 2, cores=[0, 1], settings=settings) as reps:
        slo = unloaded_slo(bench, trace, reps.urls)
        print(f"policies: SLO from the unloaded latency: {slo}", flush=True)
        for k in range(k_rep):
            pols = list(POLICIES)
            order.shuffle(pols)
            for pol in pols:
                table, path = bench.salted(trace)
                runs[pol]["real"].append(bench.replay(table, path, reps.urls, pol))
                runs[pol]["sim"].append(bench.simulate(table, path, cfg, seed + k, pol))
    out: dict[str, Any] = {"slo": slo, "policies": {}}
    figs: dict[str, dict[str, dict[str, list[float]]]] = {"goodput": {}, "ttft_p99_ms": {}}
    for pol in POLICIES:
        for key, fn in (("goodput", lambda rows: goodput(rows, span, slo)),
                        ("ttft_p99_ms", lambda rows: 1e3 * float(np.percentile(latencies(rows)["ttft"], 99)))):
            figs[key][pol] = {side: [fn(r) for r in runs[pol][side]] for side in ("real", "sim")}
        out["policies"][pol] = {key: figs[key][pol] for key in figs}
    out["ranking"] = {"goodput": ranking(figs["goodput"], True), "ttft_p99_ms": ranking(figs["ttft_p99_ms"], False)}
    return out


if __name__ == "__main__":
    main()
