"""A 200-cell simulator sweep on the local process pool and on a local Ray instance.

Prints wall time, cells per second and the speed-up over one worker for each
executor, then checks that both wrote byte-identical request tables and the
same stability curves (the done-when of issue 8), with the largest relative
difference between figures (metrics' ITL mean may differ in its last bit
between copies of a run in different folders). Ray is skipped, with a note,
when it is not installed.

    python benchmarks/sweep_executors.py [--requests 500] [--workers N]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from llmlb_bench.sweep import SweepOutcome, make_executor, parse_sweep, run_sweep

REPO = Path(__file__).resolve().parents[1]


def grid(requests: int):
    """5 policies x 2 clusters x 10 rate scales x 2 seeds = 200 cells of the chat workload."""
    data = {
        "name": "bench", "slo": "ttft=500ms,tpot=50ms", "seeds": [1, 2],
        "workloads": {"chat": {"spec": str(REPO / "workloads" / "chat.toml"), "requests": requests}},
        "clusters": {"a100x2": {"replicas": 2}, "a100x4": {"replicas": 4}},
        "policies": {"round_robin": {}, "random": {}, "least_outstanding": {}, "least_tokens": {},
                     "p2c": {"policy": "power_of_d", "args": {"d": 2}}},
        "load": {"rate_scale": [0.1 * k for k in range(1, 11)]},
    }
    return parse_sweep(data, "bench", REPO)


def timed(name: str, workers: int, spec, results: Path) -> tuple[SweepOutcome, float]:
    t0 = time.perf_counter()
    with make_executor(name, workers) as ex:
        outcome = run_sweep(spec, results, ex)
    return outcome, time.perf_counter() - t0


def max_relative_difference(a: object, b: object) -> float:
    """Largest relative difference between the numbers of two same-shaped curve structures."""
    if isinstance(a, dict) and isinstance(b, dict):
        return max((max_relative_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list) and isinstance(b, list):
        return max((max_relative_difference(x, y) for x, y in zip(a, b)), default=0.0)
    if isinstance(a, float) and isinstance(b, float) and a != b:
        return abs(a - b) / max(abs(a), abs(b))
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500, help="requests per cell")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    spec = grid(args.requests)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        one, t_one = timed("local", 1, spec, tmp_path / "one")
        runs = {"local x1": (one, t_one)}
        runs[f"local x{args.workers}"] = timed("local", args.workers, spec, tmp_path / "local")
        if importlib.util.find_spec("ray"):
            runs[f"ray x{args.workers}"] = timed("ray", args.workers, spec, tmp_path / "ray")
        else:
            print("ray: not installed (pip install 'llmlb-bench[ray]'), skipped")
        print(f"{len(one.cells)} cells of {args.requests} requests, {os.cpu_count()} CPUs")
        print(f"{'executor':<12} {'wall s':>8} {'cells/s':>8} {'speed-up':>9}")
        for name, (outcome, wall) in runs.items():
            assert outcome.ran == len(one.cells)
            print(f"{name:<12} {wall:>8.1f} {len(one.cells) / wall:>8.1f} {t_one / wall:>8.2f}x")
        for name, (outcome, _) in runs.items():
            same = all(pq.read_table(one.root / c.run_id / "requests.parquet").equals(
                pq.read_table(outcome.root / c.run_id / "requests.parquet")) for c in one.cells)
            worst = max_relative_difference(outcome.curves, one.curves)
            print(f"{name}: requests identical to local x1: {same}; curves identical: {outcome.curves == one.curves} "
                  f"(largest relative difference {worst:.1e})")


if __name__ == "__main__":
    main()
