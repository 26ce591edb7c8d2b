"""The prefix-cache accounting of a large run: metrics.cache_accounting.account on synthetic rows.

    python benchmarks/cache_accounting_speed.py                       # 250k requests, 40 blocks each, 3 repeats
    python benchmarks/cache_accounting_speed.py --requests 1000000 --repeats 1
    python benchmarks/cache_accounting_speed.py --simulate 100000   # its share of a simulated run
    python benchmarks/cache_accounting_speed.py --simulate 30000 --policy least_outstanding

Each request has 40 prompt blocks of 16 tokens: 30 shared with one of 1,000 groups and 10 of
its own, on one of 4 targets (a reuse-heavy case: most blocks take part in the per-target pass).
With ``--simulate N`` it instead simulates N requests of ``workloads/shared-prefix.toml`` (at 25x
its rate, four replicas, ``--policy``: cache_aware unless named) and times the run and, apart (the
median of three calls), the accounting it wrote at its end: the share is the accounting's CPU over the run's, so a cheaper
policy (least_outstanding, no prefix index) shows it against the simulator alone. Prints each
repeat's wall and CPU time (on a shared machine the CPU time is the figure to read), the median
and range, the peak resident memory of the process and the load average (the machine is shared:
compare figures taken at a similar load).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmlb_bench.metrics.cache_accounting import account, write_accounting


def rows_and_hashes(n: int, seed: int = 0) -> tuple[pa.Table, pa.ListArray]:
    rng = np.random.default_rng(seed)
    shared, own = 30, 10
    group = rng.integers(0, 1000, n)
    prefix = (group[:, None] * 1000 + np.arange(shared)).astype(np.uint64)
    tail = (10**9 + np.arange(n * own).reshape(n, own)).astype(np.uint64)
    flat = np.concatenate([prefix, tail], axis=1).ravel()
    width = shared + own
    hashes = pa.ListArray.from_arrays(pa.array(np.arange(0, n * width + 1, width, dtype=np.int32)), pa.array(flat))
    t = np.sort(rng.uniform(0, n / 100, n))
    rows = pa.table({
        "request_id": np.arange(n), "target": pa.array([f"r{i}" for i in rng.integers(0, 4, n)]),
        "prefill_target": pa.nulls(n, pa.string()), "status": pa.array(["ok"] * n),
        "scheduled_s": t, "sent_s": t, "first_token_s": t + 0.1,
        "input_tokens": np.full(n, width * 16 + 5, np.int32), "output_tokens": np.full(n, 50, np.int32),
        "reasoning_tokens": np.zeros(n, np.int32),
        "cached_tokens": np.full(n, shared * 16, np.int32), "predicted_cached_tokens": pa.nulls(n, pa.int32())})
    return rows, hashes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=250_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--simulate", type=int, default=0, help="simulate this many requests instead")
    ap.add_argument("--policy", default="cache_aware", help="the simulated run's routing policy")
    args = ap.parse_args()
    if args.simulate:
        simulated(args.simulate, args.repeats, args.policy)
        return
    rows, hashes = rows_and_hashes(args.requests)
    parent = np.full(args.requests, -1, dtype=np.int64)
    times = []
    for k in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        account(hashes, parent, 16, rows, {})
        times.append(time.perf_counter() - t0)
        print(f"repeat {k + 1}: {times[-1]:.2f} s ({time.process_time() - c0:.2f} CPU-s)")
    blocks = len(hashes.flatten())
    print(f"{args.requests:,} requests, {blocks:,} blocks: median {statistics.median(times):.2f} s "
          f"(range {min(times):.2f}-{max(times):.2f}); peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def simulated(n: int, repeats: int, policy: str) -> None:
    from llmlb_bench.experiment import simulate_run
    from llmlb_bench.repro.traces import preset
    from llmlb_bench.schema import read_trace, write_trace
    from llmlb_bench.sim import ClusterConfig

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.parquet"
        write_trace(preset("shared-prefix", seed=1, rate_scale=25.0, requests=n), path, block_size=16)
        trace = read_trace(path)
        for k in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            store = simulate_run(trace, path, ClusterConfig.build(replicas=4), policy, {}, 0,
                                 Path(tmp) / "runs", run_id=f"r{k}")
            run_s, run_c = time.perf_counter() - t0, time.process_time() - c0
            calls = []
            for _ in range(3):      # NumPy's memory-bound passes vary call to call on a shared machine
                t0, c0 = time.perf_counter(), time.process_time()
                write_accounting(store.dir, store.run_id, trace, store.summary["prefix_cache_units"])
                calls.append((time.process_time() - c0, time.perf_counter() - t0))
            acc_c, acc_s = sorted(calls)[1]
            print(f"repeat {k + 1}: run (accounting included) {run_s:.2f} s ({run_c:.2f} CPU-s), accounting alone "
                  f"(median of 3 calls by CPU: {', '.join(f'{c:.2f}' for c, _ in calls)}) {acc_s:.2f} s ({acc_c:.2f} CPU-s, "
                  f"{acc_c / n * 1e6:.1f} us per request): {acc_s / run_s:.0%} of the run, "
                  f"{acc_c / run_c:.1%} in CPU time")
    print(f"{n:,} requests, {policy}; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB; load "
          f"average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
