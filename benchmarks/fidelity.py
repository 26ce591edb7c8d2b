"""Sim-to-real fidelity: the simulator with a calibrated profile against real vLLM CPU replicas.

One run of this script (about 10-15 minutes on 2 cores; run it under the measurement lock):

1. writes the tiny random-weight model, starts one vLLM CPU replica pinned to core 1 (this
   client stays on core 0) and calibrates it (``llmlb calibrate``'s probes and fit);
2. measures the replica's capacity for each trace shape (closed loop, more users than seats:
   completed requests per second);
3. replays each shape at about 30, 60 and 90% of that capacity against vLLM and simulates the
   same trace with the profile; prints TTFT, TPOT, ITL and E2E at p50/p90/p99 side by side
   with their relative errors, the per-request E2E median absolute percentage error over
   matched requests, cached prompt tokens, and running / waiting time-averages (vLLM's gauges,
   scraped twice a second, against the simulator's series); the 60% Poisson trace is replayed
   ``--repeats`` times to give the run-to-run noise;
4. the same trace against ``llmlb serve --profile`` (the simulator in real time over HTTP);
5. restarts vLLM with a tiny KV cache (``--num-gpu-blocks-override``) and compares preemptions
   on a burst that cannot fit;
6. starts two replicas (one core each) and ranks three policies on goodput and TTFT p99,
   real against simulated.

Shapes: Poisson; bursty Gamma arrivals with CV 3; multi-turn sessions over shared system
prompts with heavy-tailed (lognormal) lengths. Figures are printed and written as JSON
(``--out``); docs/fidelity.md publishes a run with its command, date and load average.

    flock /tmp/llmlb-measure.lock .venv/bin/python benchmarks/fidelity.py --out fidelity.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.calibrate import calibrate
from llmlb_bench.engines.tiny_hf import word_token_ids
from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, replay
from llmlb_bench.schema import read_trace, trace_table, write_trace
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from llmlb_bench.sweep.endpoint_capacity import fresh_prompts
from llmlb_bench.workload import WorkloadSpec, generate

ROOT = Path(__file__).resolve().parents[1]
SEQS, BUDGET, BLOCK = 16, 512, 128
LOADS = (0.3, 0.6, 0.9)
POLICIES = ("random", "least_outstanding", "cache_aware")
#: the policy ranking's SLO: a few times the tiny model's unloaded TTFT and TPOT on one core
SLO_TTFT_S, SLO_TPOT_S = 0.1, 0.015
PERCENTILES = (50, 90, 99)

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
    def __init__(self, work: Path, extra_body: dict[str, Any]) -> None:
        self.work = work
        self.n = 0
        #: every replay's further body fields: the tiny model's answers kept to whole words
        #: (engines.tiny_hf.word_token_ids), so that multi-turn replays, which send each answer
        #: back in the next turn (replay.threads), can reuse its KV as with a real model's text
        self.extra_body = extra_body

    def _path(self, table: pa.Table) -> tuple[pa.Table, Path]:
        self.n += 1
        path = self.work / "traces" / f"{self.n:03d}.parquet"
        write_trace(table, path, block_size=BLOCK)
        return read_trace(path), path

    def replay(self, table: pa.Table, urls: list[str], policy: str = "round_robin", users: int | None = None,
               scrape_s: float | None = 0.5) -> tuple[list[dict], list[dict]]:
        """Replay with fresh prompt text (ids and hashes salted per replay: the engine's prefix cache
        must not serve one replay from another's prompts, the simulator starts cold); the rows get
        the trace's request ids back."""
        salt = 0x9E3779B97F4A7C15 * (self.n + 1) % (1 << 62)
        table, path = self._path(fresh_prompts(table, salt))
        offset = (salt % (1 << 30)) << 32
        opts = ReplayOptions(api="completions", tokenize=True, users=users, scrape_s=scrape_s,
                             extra_body=self.extra_body)
        store = RunStore(self.work / "runs", config={}, backend="replay", run_id=f"{self.n:03d}-real", trace_path=path,
                         trace_rows=table.num_rows)
        with store:
            replay(table, urls, make_policy(policy, {}, seed=0), store, opts)
        rows, series = _rows(store.dir)
        for r in rows:
            r["request_id"] -= offset
        return rows, series

    def simulate(self, table: pa.Table, cfg: ClusterConfig, policy: str = "round_robin") -> tuple[list[dict], list[dict]]:
        table, path = self._path(table)
        cfg = ClusterConfig.from_dict({**cfg.to_dict(), "series_interval_s": 0.5})
        store = RunStore(self.work / "runs", config={"cluster": cfg.to_dict()}, backend="sim",
                         run_id=f"{self.n:03d}-sim", trace_path=path, trace_rows=table.num_rows)
        with store:
            simulate(table, cfg, make_policy(policy, {}, seed=0), store, seed=0)
        return _rows(store.dir)


def _rows(folder: Path) -> tuple[list[dict], list[dict]]:
    series = folder / "series.parquet"
    return (pq.read_table(folder / "requests.parquet").to_pylist(),
            pq.read_table(series).to_pylist() if series.exists() else [])


def latencies(rows: list[dict]) -> dict[str, np.ndarray]:
    """TTFT, TPOT, ITL and E2E (docs/metrics.md) of the ok rows, seconds from the send."""
    ok = [r for r in rows if r["status"] == "ok" and r["first_token_s"] is not None]
    ttft = np.array([r["first_token_s"] - r["sent_s"] for r in ok])
    e2e = np.array([r["last_token_s"] - r["sent_s"] for r in ok])
    multi = [(r, e) for r, e, t in zip(ok, e2e, ttft) if r["output_tokens"] > 1]
    tpot = np.array([(e - (r["first_token_s"] - r["sent_s"])) / (r["output_tokens"] - 1) for r, e in multi])
    itl = []
    for r in ok:
        times = np.sort(np.concatenate([s["start_s"] + s["gap_s"] * np.arange(s["count"]) for s in r["token_times"]]))
        itl.append(np.diff(times))
    return {"ttft": ttft, "tpot": tpot, "itl": np.concatenate(itl) if itl else np.zeros(0), "e2e": e2e}


def compare(real: list[dict], sim: list[dict]) -> dict[str, Any]:
    """Percentiles and their relative errors (sim / real - 1), matched-request E2E MAPE, cached tokens."""
    lr, ls = latencies(real), latencies(sim)
    out: dict[str, Any] = {}
    for m in ("ttft", "tpot", "itl", "e2e"):
        for p in PERCENTILES:
            a, b = float(np.percentile(lr[m], p)), float(np.percentile(ls[m], p))
            out[f"{m}_p{p}"] = {"real_ms": 1e3 * a, "sim_ms": 1e3 * b, "err_pct": 100 * (b / a - 1) if a else None}
    by_id = {r["request_id"]: r for r in sim if r["status"] == "ok"}
    ape = [abs((by_id[r["request_id"]]["last_token_s"] - by_id[r["request_id"]]["sent_s"])
               / (r["last_token_s"] - r["sent_s"]) - 1)
           for r in real if r["status"] == "ok" and r["last_token_s"] is not None and r["request_id"] in by_id]
    out["e2e_mape_pct"] = 100 * float(np.median(ape)) if ape else None
    cr = sum(r["cached_tokens"] or 0 for r in real)
    cs = sum(r["cached_tokens"] or 0 for r in sim)
    out["cached_tokens"] = {"real": cr, "sim": cs, "err_pct": 100 * (cs / cr - 1) if cr else None,
                           "per_request_real": cr / max(1, len(real)), "per_request_sim": cs / max(1, len(sim))}
    out["ok"] = {"real": sum(r["status"] == "ok" for r in real), "sim": sum(r["status"] == "ok" for r in sim),
                 "of": len(real)}
    return out


def gauges(series: list[dict], end: float) -> dict[str, float]:
    """Time-averaged running and waiting over [0, end] from series samples (summed over targets)."""
    by_t: dict[float, list[float]] = {}
    for s in series:
        if s["t_s"] <= end and s["running"] is not None:
            v = by_t.setdefault(round(s["t_s"], 3), [0.0, 0.0])
            v[0] += s["running"] or 0
            v[1] += s["waiting"] or 0
    arr = np.array(list(by_t.values())) if by_t else np.zeros((1, 2))
    return {"running": float(arr[:, 0].mean()), "waiting": float(arr[:, 1].mean())}


def goodput(rows: list[dict], span: float) -> float:
    """Requests per second that met the SLO (``SLO_TTFT_S`` and ``SLO_TPOT_S``)."""
    good = 0
    for r in rows:
        if r["status"] != "ok" or r["first_token_s"] is None:
            continue
        ttft = r["first_token_s"] - r["sent_s"]
        tpot = ((r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)) if r["output_tokens"] > 1 else 0
        good += ttft <= SLO_TTFT_S and tpot <= SLO_TPOT_S
    return good / span


def metric_total(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{") or
               line.startswith(name + " "))


def capacity(bench: Bench, url: str, shape: str) -> float:
    """Completed requests per second at saturation: closed loop with twice as many users as seats."""
    rows, _ = bench.replay(trace_at(shape, 1.0, 96), [url], users=2 * SEQS, scrape_s=None)
    ok = [r for r in rows if r["status"] == "ok"]
    span = max(r["last_token_s"] for r in ok) - min(r["sent_s"] for r in ok)
    return len(ok) / span


def table_line(label: str, c: dict[str, Any]) -> str:
    cells = [f"{label:<22}"]
    for m in ("ttft", "tpot", "itl", "e2e"):
        cells.append(" ".join(f"{c[f'{m}_p{p}']['err_pct']:+6.1f}" if c[f"{m}_p{p}"]["err_pct"] is not None
                              else "   n/a" for p in PERCENTILES))
    cells.append(f"{c['e2e_mape_pct']:6.1f}" if c["e2e_mape_pct"] is not None else "   n/a")
    ce = c["cached_tokens"]["err_pct"]
    cells.append(f"{ce:+6.1f}" if ce is not None else "   n/a")
    return " | ".join(cells)


HEADER = (f"{'run':<22} | {'TTFT err % p50 p90 p99':<20} | {'TPOT err % p50/90/99':<20} | "
          f"{'ITL err % p50/90/99':<20} | {'E2E err % p50/90/99':<20} | E2E MAPE | cached err %")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    ap.add_argument("--requests", type=int, default=150, help="requests per latency trace")
    ap.add_argument("--repeats", type=int, default=3, help="replays of the 60%% Poisson trace (noise)")
    ap.add_argument("--shapes", default="", help="comma-separated trace shapes to replay (default all: "
                    + ", ".join(SHAPES) + ")")
    ap.add_argument("--skip", default="", help="comma-separated stages to skip: serve, tiny_kv, policies")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    wanted = set(filter(None, args.shapes.split(",")))
    if wanted - set(SHAPES):
        ap.error(f"--shapes: choose from {', '.join(SHAPES)}")
    shapes = [s for s in SHAPES if s in wanted] if wanted else list(SHAPES)

    def save() -> None:         # after every stage, so a later failure keeps what was measured
        if args.out:
            args.out.write_text(json.dumps(out, indent=1))
    os.sched_setaffinity(0, {0})            # the client on core 0, the engine on core 1
    started = time.time()
    out: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                           "load_average_start": os.getloadavg(), "settings": {"max_num_seqs": SEQS,
                                                                               "max_num_batched_tokens": BUDGET}}
    with tempfile.TemporaryDirectory(prefix="llmlb-fidelity-") as tmp:
        work = Path(tmp)
        model = write_tiny_model(work / "tiny")
        bench = Bench(work, {"allowed_token_ids": word_token_ids(model)})
        settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)
        with VllmReplicas(model, 1, cores=[1], settings=settings) as reps:
            url = reps.urls[0]
            t = time.time()
            cal = calibrate(url, {"max_num_seqs": SEQS, "max_num_batched_tokens": BUDGET},
                            options=ReplayOptions(api="completions", tokenize=True), max_prompt=2 * BUDGET)
            profile = cal.profile
            out["calibration"] = {"seconds": time.time() - t, "step": profile["step"],
                                  "request_overhead_s": profile["request_overhead_s"],
                                  "request_per_prompt_token_s": profile["request_per_prompt_token_s"],
                                  "fit": profile["fit"]["by_probe"]}
            print(f"calibrated in {time.time() - t:.0f} s: {profile['step']}, overhead "
                  f"{1e3 * profile['request_overhead_s']:.2f} ms; fit {profile['fit']['by_probe']}", flush=True)
            cfg = ClusterConfig.build(replicas=1).with_profile(profile)
            out["capacity"] = {s: capacity(bench, url, s) for s in shapes}
            print(f"capacity (req/s): {out['capacity']}", flush=True)
            save()
            out["latency"] = []
            print(HEADER)
            for shape in shapes:
                for load in LOADS:
                    rate = load * out["capacity"][shape]
                    trace = trace_at(shape, rate, args.requests)
                    repeats = args.repeats if (shape, load) == ("poisson", 0.6) else 1
                    sim, sim_series = bench.simulate(trace, cfg)
                    for k in range(repeats):
                        real, real_series = bench.replay(trace, [url])
                        if (shape, load, k) == ("poisson", 0.6, 0):
                            serve_trace, serve_real = trace, real
                        c = compare(real, sim)
                        end = float(max(r["last_token_s"] or 0 for r in real))
                        c["gauges"] = {"real": gauges(real_series, end), "sim": gauges(sim_series, end)}
                        c.update(shape=shape, load=load, rate=rate, repeat=k)
                        out["latency"].append(c)
                        print(table_line(f"{shape} {int(load * 100)}% #{k}", c), flush=True)
                        save()
                    if repeats > 1:
                        # run-to-run noise: the real replays against each other
                        runs = [c for c in out["latency"] if (c["shape"], c["load"]) == (shape, load)]
                        for m in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90"):
                            v = [c[m]["real_ms"] for c in runs]
                            out.setdefault("noise", {})[m] = {"min_ms": min(v), "max_ms": max(v),
                                                              "spread_pct": 100 * (max(v) / min(v) - 1)}
                        print(f"noise over {repeats} replays: " + ", ".join(
                            f"{m} {v['spread_pct']:.1f}%" for m, v in out["noise"].items()), flush=True)
        stages = [(name, fn) for name, fn in (("serve", lambda: serve_stage(bench, work, profile, serve_trace, serve_real)),
                                              ("tiny_kv", lambda: tiny_kv(bench, model, profile)),
                                              ("policies", lambda: policy_ranking(bench, model, profile,
                                                                                  out["capacity"]["multiturn"])))
                  if name not in skip]
        for name, fn in stages:
            try:
                out[name] = fn()
            except Exception as exc:        # keep the other stages' figures; say what failed
                out[name] = {"error": repr(exc)}
            print(f"{name}: {json.dumps(out[name])}", flush=True)
            save()
    out["seconds"] = time.time() - started
    out["load_average_end"] = os.getloadavg()
    print(f"done in {out['seconds']:.0f} s; load average {out['load_average_start']} -> {out['load_average_end']}")
    save()


def serve_stage(bench: Bench, work: Path, profile: dict[str, Any], trace: pa.Table, real: list[dict]) -> dict[str, Any]:
    """``llmlb serve --profile`` (pinned to core 1) replaying the trace of the first 60% Poisson
    vLLM replay: errors are llmlb serve / vLLM - 1."""
    prof_path = work / "profile.json"
    prof_path.write_text(json.dumps(profile))
    proc = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-m", "llmlb_bench", "serve", "--profile",
                             str(prof_path), "--replicas", "1", "--port", "0", "--served-model-name", "tiny"],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    try:
        url = next(line.split()[1] for line in proc.stdout if " http://" in line)
        served, _ = bench.replay(trace, [url], scrape_s=None)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    c = compare(real, served)
    print(table_line("serve vs vLLM", c), flush=True)
    return c


def tiny_kv(bench: Bench, model: Path, profile: dict[str, Any]) -> dict[str, Any]:
    """A burst of 24 requests of 256 + 256 tokens on 40 KV blocks of 128 (5,120 tokens): preemptions."""
    blocks = 40
    trace = trace_table(np.zeros(24), 256, 256, "tiny-kv")
    small = {**profile, "engine": {**profile["engine"], "num_kv_blocks": blocks}}
    settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET, num_gpu_blocks=blocks)
    with VllmReplicas(model, 1, cores=[1], settings=settings) as reps:
        before = metric_total(reps.urls[0], "vllm:num_preemptions_total")
        real, _ = bench.replay(trace, reps.urls)
        real_preempt = metric_total(reps.urls[0], "vllm:num_preemptions_total") - before
    sim, _ = bench.simulate(trace, ClusterConfig.build(replicas=1).with_profile(small))
    c = compare(real, sim)
    return {"blocks": blocks, "preemptions_real": real_preempt,
            "preemptions_sim": sum(r["preemptions"] or 0 for r in sim),
            "e2e_p50_err_pct": c["e2e_p50"]["err_pct"], "e2e_p90_err_pct": c["e2e_p90"]["err_pct"],
            "ttft_p50_err_pct": c["ttft_p50"]["err_pct"]}


def policy_ranking(bench: Bench, model: Path, profile: dict[str, Any], cap1: float) -> dict[str, Any]:
    """Three policies over two replicas (cores 0 and 1) on the multi-turn shared-prefix trace at
    about 70% of two replicas' capacity, real against simulated, each real run twice."""
    trace = trace_at("multiturn", 0.7 * 2 * cap1, 200)
    span = float(np.max(trace.column("arrival_s").to_numpy()))
    cfg = ClusterConfig.build(replicas=2).with_profile(profile)
    settings = VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)
    out: dict[str, Any] = {}
    with VllmReplicas(model, 2, cores=[0, 1], settings=settings) as reps:
        for pol in POLICIES:
            sim, _ = bench.simulate(trace, cfg, pol)
            real_runs = [bench.replay(trace, reps.urls, pol, scrape_s=0.5)[0] for _ in range(2)]
            out[pol] = {"sim": {"goodput": goodput(sim, span), "ttft_p99_ms": 1e3 * float(np.percentile(latencies(sim)["ttft"], 99))},
                        "real": [{"goodput": goodput(r, span),
                                  "ttft_p99_ms": 1e3 * float(np.percentile(latencies(r)["ttft"], 99))} for r in real_runs]}
    for key in ("goodput", "ttft_p99_ms"):
        sim_order = sorted(POLICIES, key=lambda p: out[p]["sim"][key], reverse=key == "goodput")
        real_order = sorted(POLICIES, key=lambda p: np.mean([r[key] for r in out[p]["real"]]), reverse=key == "goodput")
        out[f"order_{key}"] = {"sim": sim_order, "real": real_order}
    return out


if __name__ == "__main__":
    main()
