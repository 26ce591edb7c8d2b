"""How often does ``llmlb gate`` fail with no change (family-wise), and how often does it catch a 5% regression?

Three pools of runs of the chat workload (400 requests at 0.75 x its rate,
2 replicas), made once (``--pool DIR`` keeps them between invocations):

* **simulated, paired**: 16 traces x 16 seeds of ``power_of_d``'s random
  choices (``simulate_run``); a trial draws ``--repeats`` traces and, for
  each, two different seeds: one run for the baseline, one for the candidate
  (same trace: the gate pairs them);
* **simulated, unpaired**: 60 traces, each simulated once with its own seed
  under ``least_outstanding``; a trial draws ``--repeats`` runs a side, no
  trace on both sides (repeats with other seeds);
* **replay, paired**: ``--traces`` traces, each replayed ``--replays`` times by
  ``llmlb replay`` (a subprocess) against one ``llmlb serve`` (a subprocess;
  2 replicas, server-side least-outstanding, ``--speed 2``) on loopback:
  every row is a real measured request; a trial draws pairs as above.

Trials (``--trials`` each; ``--single-trials`` with one run a side, whose
bootstrap costs 100x the CPU): **no change** decides the gate on the drawn
runs as they are; **regression** first changes the candidate's rows: every
latency (TTFT, TPOT, E2E) x 1.05 with goodness re-derived from the SLO
("latency x1.05"), or 5% of the good requests chosen at random turned not
good ("goodput -5%"); half the trials each. The rows are the runs' own; only
the choice of runs and the injection are drawn. Runs recur across trials
(the pools are finite), so trials are not fully independent and the printed
binomial (Wilson) intervals are somewhat narrower than the truth.

The gate's rules have zero allowance (``goodput >= -0%``, ``p99_ttft <= +0%``,
...): with no change every rule sits on its limit, the hardest case for the
family-wise false-fail rate, and a 5% regression is 5% beyond each limit.

    flock /tmp/llmlb-measure.lock nice -n 5 python benchmarks/gate_power.py [--trials 1000] [--repeats 1,3,5,8]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from llmlb_bench.experiment import simulate_run
from llmlb_bench.gate import parse_rule
from llmlb_bench.gate.decide import decide_family
from llmlb_bench.gate.samples import RunSample, load_side
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.schema import read_trace, write_trace
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.workload import generate, load_spec

ROOT = Path(__file__).resolve().parents[1]
SLO = "ttft=500ms,tpot=50ms"
RULES = ["goodput >= -0%", "p99_ttft <= +0%", "mean_ttft <= +0%", "mean_tpot <= +0%", "mean_e2e <= +0%"]
REQUESTS, RATE_SCALE = 400, 0.75


def _trace(folder: Path, seed: int) -> Path:
    spec = load_spec(ROOT / "workloads" / "chat.toml").replace(requests=REQUESTS)
    path = folder / f"chat-s{seed}.parquet"
    if not path.exists():
        write_trace(generate(spec, seed=seed, rate_scale=RATE_SCALE), path, spec=spec.to_dict())
    return path


def sim_pool(folder: Path, traces: int, seeds: int, policy: str) -> list[RunSample]:
    """``seeds`` simulated runs (policy seeds) of each of ``traces`` traces (kept in ``folder`` between invocations)."""
    for s in range(1, traces + 1):
        for k in range(seeds):
            if not (folder / "runs" / f"t{s}-k{k}").exists():
                path = _trace(folder / "traces", s)
                simulate_run(read_trace(path), path, ClusterConfig.build(replicas=2), policy, {}, k, folder / "runs",
                             run_id=f"t{s}-k{k}")
    return [r for case in load_side([folder / "runs"], Slo.parse(SLO)).values() for r in case]


def replay_pool(folder: Path, traces: int, replays: int) -> list[RunSample]:
    """``replays`` real replays of each of ``traces`` traces against one ``llmlb serve`` (kept between invocations)."""
    todo = [(s, k) for s in range(1, traces + 1) for k in range(replays)
            if not (folder / "runs" / f"t{s}-r{k}" / "requests.parquet").exists()]
    if todo:
        server = subprocess.Popen([sys.executable, "-m", "llmlb_bench", "serve", "--replicas", "2", "--port", "0",
                                   "--policy", "least_outstanding", "--speed", "2"], cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline() if server.stdout else ""
            if " http://" not in line:
                raise SystemExit(f"llmlb serve did not start: {line!r}")
            url = line.split()[1]
            for s, k in todo:
                path = _trace(folder / "traces", s)
                subprocess.run([sys.executable, "-m", "llmlb_bench", "replay", str(path), "-e", url,
                                "--time-scale", "0.5", "-r", str(folder / "runs"), "--run-id", f"t{s}-r{k}",
                                "--no-progress"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
                print(f"  replayed trace {s}, replay {k}", file=sys.stderr, flush=True)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return [r for case in load_side([folder / "runs"], Slo.parse(SLO)).values() for r in case]


def slower(run: RunSample, factor: float) -> RunSample:
    """Every latency x ``factor``; a good request stays good only if its slower TTFT and TPOT meet the SLO."""
    latency = {k: v * factor for k, v in run.latency.items()}
    limits = Slo.parse(SLO).limits_for(None)  # type: ignore[union-attr]
    good = run.good & (latency["ttft_s"] <= limits["ttft"]) & (latency["tpot_s"] <= limits["tpot"])
    return replace(run, latency=latency, good=good)


def fewer_good(run: RunSample, share: float, rng: np.random.Generator) -> RunSample:
    """``share`` of the good requests, drawn at random, turned not good (goodput x (1 - share))."""
    good = run.good.copy()
    idx = np.flatnonzero(good)
    good[rng.choice(idx, round(share * len(idx)), replace=False)] = False
    return replace(run, good=good)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = k / n
    mid, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def rate(label: str, k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{label}: {k}/{n} = {100 * k / n:.2f}% [95% CI {100 * lo:.2f}, {100 * hi:.2f}]"


def draw_unpaired(pool: list[RunSample], repeats: int, rng: np.random.Generator) -> tuple[list[RunSample], list[RunSample]]:
    """``repeats`` runs of different traces a side, no trace on both sides (other seeds, as in CI repeats)."""
    by_trace: dict[str, list[RunSample]] = {}
    for r in pool:
        by_trace.setdefault(r.trace or "", []).append(r)
    traces = sorted(by_trace)
    pick = rng.choice(len(traces), 2 * repeats, replace=False)
    runs = [by_trace[traces[t]][rng.integers(0, len(by_trace[traces[t]]))] for t in pick]
    return runs[:repeats], runs[repeats:]


def draw_paired(pool: list[RunSample], repeats: int, rng: np.random.Generator) -> tuple[list[RunSample], list[RunSample]]:
    """``repeats`` pairs: a trace drawn at random, two different replays of it (no replay used twice)."""
    by_trace: dict[str, list[RunSample]] = {}
    for r in pool:
        by_trace.setdefault(r.trace or "", []).append(r)
    left = {t: list(rng.permutation(len(runs))) for t, runs in by_trace.items()}
    base, cand = [], []
    while len(base) < repeats:
        t = sorted(t for t, idx in left.items() if len(idx) >= 2)[rng.integers(0, sum(len(i) >= 2 for i in left.values()))]
        i, j = left[t].pop(), left[t].pop()
        base.append(by_trace[t][i])
        cand.append(by_trace[t][j])
    return base, cand


def trials(name: str, pool: list[RunSample], draw, n: int, repeats: int, confidence: float, seed: int) -> None:
    rules = [parse_rule(r) for r in RULES]
    rng = np.random.default_rng(seed)
    start = time.process_time()
    null_fails, per_rule, repeats_seen, designs = 0, dict.fromkeys(RULES, 0), {r: [] for r in RULES}, set()
    for k in range(n):
        base, cand = draw(pool, repeats, rng)
        verdicts = decide_family([("c", base, cand)], rules, confidence, seed=k)
        null_fails += any(v.status == "fail" for v in verdicts)
        for v in verdicts:
            per_rule[v.rule] += v.status == "fail"
            designs.add(v.design)
            if v.repeats_needed is not None:
                repeats_seen[v.rule].append(v.repeats_needed)
    caught = {"latency x1.05": 0, "goodput -5%": 0}
    for k in range(n):
        base, cand = draw(pool, repeats, rng)
        kind = "latency x1.05" if k % 2 == 0 else "goodput -5%"
        cand = [slower(r, 1.05) if kind == "latency x1.05" else fewer_good(r, 0.05, rng) for r in cand]
        verdicts = decide_family([("c", base, cand)], rules, confidence, seed=n + k)
        caught[kind] += any(v.status == "fail" for v in verdicts)
    cpu = time.process_time() - start
    print(f"\n## {name}: {len(pool)} runs in the pool ({len({r.trace for r in pool})} traces), {repeats} repeats a side, design {', '.join(sorted(designs))}, "
          f"family-wise level {1 - confidence:g}, {cpu:.0f} s CPU ({1e3 * cpu / (2 * n):.0f} ms a gate)")
    print("- " + rate("no change, the gate fails (family-wise false-fail)", null_fails, n))
    print("  - per rule: " + ", ".join(f"`{r}` {c}" for r, c in per_rule.items()))
    for kind, c in caught.items():
        print("- " + rate(f"regression {kind}, the gate fails (power)", c, n // 2 + (n % 2 if kind.startswith("lat") else 0)))
    print("- repeats a side to catch 5% beyond the limit with 90% power (median over no-change trials): "
          + ", ".join(f"`{r}` {int(np.median(v))}" for r, v in repeats_seen.items() if v))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=1000, help="no-change trials, and as many regression trials")
    ap.add_argument("--repeats", default="1,3,5,8", help="runs a side (comma-separated: one measurement each)")
    ap.add_argument("--single-trials", type=int, default=200, help="trials of each kind with one run a side")
    ap.add_argument("--confidence", type=float, default=0.99)
    ap.add_argument("--traces", type=int, default=4, help="replay pool: traces")
    ap.add_argument("--replays", type=int, default=10, help="replay pool: replays of each trace")
    ap.add_argument("--pool", type=Path, help="keep the simulated and replayed runs here (default: a temporary folder)")
    ap.add_argument("--only", choices=("sim", "replay"))
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
          f"rules: {', '.join(RULES)}; SLO {SLO}")
    with tempfile.TemporaryDirectory() as tmp:
        pool = args.pool or Path(tmp)
        runs = []
        if args.only != "replay":
            runs.append(("simulated, paired by trace (same traces, other seeds of power_of_d's random choices)",
                         sim_pool(pool / "sim-paired", 16, 16, "power_of_d"), draw_paired))
            runs.append(("simulated, unpaired (other traces and seeds, least_outstanding)",
                         sim_pool(pool / "sim-unpaired", 60, 1, "least_outstanding"), draw_unpaired))
        if args.only != "sim":
            runs.append(("replay against llmlb serve, paired by trace",
                         replay_pool(pool / "replay", args.traces, args.replays), draw_paired))
        for k, (name, runs_, draw) in enumerate(runs):
            for repeats in (int(x) for x in args.repeats.split(",")):
                n = args.trials if repeats > 1 else args.single_trials  # one run a side: a bootstrap, 100x the CPU
                trials(name, runs_, draw, n, repeats, args.confidence, 100 * k + repeats)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
