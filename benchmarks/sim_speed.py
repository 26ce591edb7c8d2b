"""Simulator speed: the chat preset scaled to N requests on R replicas, on one core.

    python benchmarks/sim_speed.py                       # 1M requests, 16 replicas, both token_times modes
    python benchmarks/sim_speed.py --requests 100000 --token-times summary
    python benchmarks/sim_speed.py --requests 100000 --token-times summary --profile   # where the time goes
    python benchmarks/sim_speed.py --requests 200000 --token-times summary --cores --repeats 3
    python benchmarks/sim_speed.py --requests 200000 --token-times summary --cores --baseline ../base   # before/after
    mkfifo ctl ctl.ack; LLMLB_CORE=compiled perf record -D -1 --control fifo:ctl,ctl.ack -- \
        python benchmarks/sim_speed.py --requests 300000 --token-times summary --perf-control ctl   # C-level split

Prints, per run: wall and CPU seconds of the simulation (trace generation excluded),
simulated requests per second of wall time, events, and peak resident memory of the
process (each mode runs in its own process, so the figures do not mix), and which simulator core
ran (llmlb_bench/compiled_core.py). ``--cores`` runs the pure-Python core (``LLMLB_CORE=python``)
and the compiled one (``LLMLB_CORE=compiled``) alternately, ``--repeats`` pairs, each in its own
process, and prints their CPU seconds (median and range) and the speed-up of each pair; with
``--baseline DIR`` (another checkout, its compiled core built there) that checkout's compiled core
runs in each round too, between the two, so before and after are measured side by side. The trace is
workloads/chat.toml with its request count raised and its rate scaled by replicas / 4
(the preset is sized for 4 replicas), so every replica sees the preset's load.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


#: where a function's own time goes in the --profile split: (substring of its file or name, label); first match wins
PLACES = (("sim/replica.py", "replica: step boundary, planning, apply, admission, KV"),
          ("sim/kv_blocks.py", "replica: step boundary, planning, apply, admission, KV"),
          ("sim/step_plan.py", "replica: step boundary, planning, apply, admission, KV"),
          ("sim/simulation.py", "event loop and dispatch glue"), ("heapq", "event loop and dispatch glue"),
          ("trace_run.py", "event loop and dispatch glue"), ("trace_schedule.py", "event loop and dispatch glue"),
          ("policies/", "routing: Router, policy, view books"), ("trace_columns.py", "routing: Router, policy, view books"),
          ("sim/cost.py", "step cost model"), ("sim/results.py", "results: rows, Parquet"),
          ("store/", "results: rows, Parquet"), ("pyarrow", "results: rows, Parquet"),
          ("fromiter", "results: rows, Parquet"), ("gc.collect", "garbage collection"))


def split(stats: pstats.Stats) -> list[tuple[str, float]]:
    """Share of the profiled time per place (a function's own time, callees apart), largest first."""
    by: dict[str, float] = {}
    for (path, _, name), (_, _, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        place = next((label for key, label in PLACES if key in path or key in name),
                     "builtins (len, append, min...), timeline, series, other")
        by[place] = by.get(place, 0.0) + own
    total = sum(by.values()) or 1.0
    return sorted(((k, v / total) for k, v in by.items()), key=lambda kv: -kv[1])


def _perf(control: Path | None, command: str) -> None:
    """Tell ``perf record --control fifo:CTL,CTL.ack`` (started with ``-D -1``: disabled) to start or stop
    sampling, so that its profile holds ``simulate()`` alone (trace generation, imports and set-up out)."""
    if control is not None:
        with open(control, "w") as f:
            f.write(command + "\n")
        with open(f"{control}.ack") as f:
            f.readline()


def one(requests: int, replicas: int, token_times: str, policy: str, profile: bool = False,
        perf_control: Path | None = None) -> dict:
    from llmlb_bench.compiled_core import running as running_core
    from llmlb_bench.policies import make_policy
    from llmlb_bench.sim import ClusterConfig, simulate
    from llmlb_bench.store import RunStore
    from llmlb_bench.workload import generate, load_spec

    spec = load_spec(REPO / "workloads" / "chat.toml").replace(requests=requests)
    trace = generate(spec, rate_scale=replicas / 4)
    cfg = ClusterConfig.build(replicas=replicas, token_times=token_times)
    with tempfile.TemporaryDirectory() as results:
        prof = cProfile.Profile(time.process_time) if profile else None   # CPU clock: the machine may be loaded
        wall0, cpu0 = time.perf_counter(), time.process_time()
        with RunStore(results, config={"cluster": cfg.to_dict()}, backend="sim", label="speed") as run:
            if prof is not None:
                prof.enable()
            _perf(perf_control, "enable")
            summary = simulate(trace, cfg, make_policy(policy), run)
            _perf(perf_control, "disable")
            if prof is not None:
                prof.disable()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        size = sum(f.stat().st_size for f in run.dir.rglob("*") if f.is_file())   # tables are part folders
    return {"requests": requests, "replicas": replicas, "token_times": token_times, "policy": policy,
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "requests_per_s": round(requests / wall),
            "events": summary["events"], "sim_time_s": round(summary["sim_time_s"], 1),
            "status": summary["status"], "results_mb": round(size / 1e6, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "load_average": os.getloadavg()[0], "core": running_core(),
            **({"profile": [(k, round(100 * v, 1)) for k, v in split(pstats.Stats(prof))]} if prof else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--token-times", choices=("segments", "summary", "both"), default="both")
    ap.add_argument("--policy", default="least_outstanding")
    ap.add_argument("--json", action="store_true", help="print one JSON object per run")
    ap.add_argument("--profile", action="store_true",
                    help="profile simulate() (CPU clock) and print the share of time per place; times then inflate")
    ap.add_argument("--cores", action="store_true",
                    help="compare the pure-Python and the compiled simulator core, alternately")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of runs for --cores")
    ap.add_argument("--perf-control", type=Path, default=None,
                    help="perf record's --control FIFO (its ack FIFO: the same name + .ack): sample simulate() only")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="with --cores: another checkout whose compiled core runs in each round too (before/after)")
    args = ap.parse_args()
    if args.cores:
        mode = "summary" if args.token_times == "both" else args.token_times
        return compare_cores(args.requests, args.replicas, mode, args.policy, args.repeats, args.json, args.baseline)
    if args.token_times != "both":
        out = one(args.requests, args.replicas, args.token_times, args.policy, args.profile, args.perf_control)
        print(json.dumps(out) if args.json else _line(out))
        for place, pct in out.get("profile", []) if not args.json else []:
            print(f"  {pct:5.1f}%  {place}")
        return
    for mode in ("summary", "segments"):
        cmd = [sys.executable, __file__, "--requests", str(args.requests), "--replicas", str(args.replicas),
               "--token-times", mode, "--policy", args.policy]
        cmd += (["--json"] if args.json else []) + (["--profile"] if args.profile else [])
        subprocess.run(cmd, check=True)


def compare_cores(requests: int, replicas: int, token_times: str, policy: str, repeats: int, as_json: bool,
                  baseline: Path | None = None) -> None:
    """Pure Python, the baseline checkout's compiled core (if given) and this compiled core in turn,
    one process per run: CPU seconds per core (median, range) and each round's speed-up over the pure
    core, with the load average beside them."""
    bench = ["--requests", str(requests), "--replicas", str(replicas), "--token-times", token_times,
             "--policy", policy, "--json"]
    # label -> (command, environment); the baseline runs its own copy of this script on its own package
    cores = {"python": ([sys.executable, __file__, *bench], {**os.environ, "LLMLB_CORE": "python"})}
    if baseline is not None:
        base = baseline.resolve()
        cores["baseline"] = ([sys.executable, str(base / "benchmarks" / "sim_speed.py"), *bench],
                             {**os.environ, "LLMLB_CORE": "compiled", "PYTHONPATH": str(base)})
    cores["compiled"] = ([sys.executable, __file__, *bench], {**os.environ, "LLMLB_CORE": "compiled"})
    runs: dict[str, list[dict]] = {core: [] for core in cores}
    for _ in range(repeats):
        for core, (cmd, env) in cores.items():
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            runs[core].append(json.loads(out.splitlines()[-1]))
            print(f"{core}: {_line(runs[core][-1])}", flush=True)
    ratios = {core: [p["cpu_s"] / c["cpu_s"] for p, c in zip(runs["python"], rs)]
              for core, rs in runs.items() if core != "python"}
    loads = [r["load_average"] for rs in runs.values() for r in rs]
    result = {"requests": requests, "replicas": replicas, "token_times": token_times, "policy": policy,
              **{f"{core}_cpu_s": [r["cpu_s"] for r in rs] for core, rs in runs.items()},
              "speedup": [round(x, 2) for x in ratios["compiled"]],
              **({"baseline_speedup": [round(x, 2) for x in ratios["baseline"]]} if baseline is not None else {}),
              "load_average": [round(min(loads), 1), round(max(loads), 1)],
              "compiled_core": runs["compiled"][0]["core"], "events": runs["compiled"][0]["events"]}
    if as_json:
        print(json.dumps(result))
        return
    for core, rs in runs.items():
        cpu = [r["cpu_s"] for r in rs]
        print(f"{core:>8}: CPU {statistics.median(cpu):.2f} s (range {min(cpu):.2f}-{max(cpu):.2f}), "
              f"{1e6 * statistics.median(cpu) / rs[0]['events']:.2f} us of CPU per event; {rs[0]['core']}")
    for core, xs in ratios.items():
        print(f"speed-up of {core} (pure / compiled CPU, per round): median {statistics.median(xs):.2f}x, "
              f"range {min(xs):.2f}-{max(xs):.2f}x")
    print(f"load average {min(loads):.1f}-{max(loads):.1f}")


def _line(r: dict) -> str:
    return (f"{r['requests']:,} requests on {r['replicas']} replicas ({r['policy']}, token_times={r['token_times']}): "
            f"wall {r['wall_s']} s, cpu {r['cpu_s']} s, {r['requests_per_s']:,} req/s, {r['events']:,} events, "
            f"peak RSS {r['peak_rss_mb']} MB, results {r['results_mb']} MB, simulated {r['sim_time_s']} s, "
            f"status {r['status']}, load average {r['load_average']:.1f}, core: {r['core']}")


if __name__ == "__main__":
    main()
