"""Does a replay against ``llmlb serve`` give what ``llmlb simulate`` says? TTFT and TPOT percentiles.

One trace (Poisson, 10 requests/s, lognormal lengths: prompts around 800
tokens, answers around 60), two simulated A100 replicas of Llama-3-8B:

* ``simulate``: the batch simulator, least-outstanding routing;
* ``simulate, arrivals +1 ms``: the same, every arrival moved by a uniform
  0..1 ms (wall time x speed) — how much the simulated percentiles themselves
  move when arrivals move as little as a loopback client moves them (min..max
  over 10 draws);
* ``serve, client routing``: ``llmlb replay`` with least-outstanding routing
  over ``llmlb serve --port-per-replica`` (each replica its own port);
* ``serve, server routing``: ``llmlb replay`` against one ``llmlb serve --port``
  that routes with least-outstanding inside.

Each at ``--speed`` 1, 2 and 4 (the replayer's ``--time-scale`` 1/speed;
times are multiplied back by the speed). The server runs pinned to CPU 0, the
replayer here on CPU 1.

    python benchmarks/serve_fidelity.py [--requests 300] [--speeds 1,2,4]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, preflight, replay
from llmlb_bench.schema import TRACE
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore
from serve_throughput import start_server

CLUSTER = ("--replicas", "2", "--gpu", "a100-80g", "--model", "llama-3-8b")


def make_trace(n: int, seed: int = 5) -> pa.Table:
    rng = np.random.default_rng(seed)
    return TRACE.conform(pa.table({
        "request_id": pa.array(np.arange(n), pa.int64()),
        "arrival_s": pa.array(np.cumsum(rng.exponential(0.1, n))),
        "input_tokens": pa.array(np.clip(rng.lognormal(np.log(800), 0.8, n), 1, 6000).astype(np.int32)),
        "output_tokens": pa.array(np.clip(rng.lognormal(np.log(60), 0.8, n), 2, 2000).astype(np.int32)),
    }), "bench")


def figures(rows: list[dict], scale: float) -> np.ndarray:
    """[TTFT p50, p90, p99, TPOT p50, p90, p99] in milliseconds."""
    ok = [r for r in rows if r["status"] == "ok"]
    ttft = np.array([r["first_token_s"] - r["sent_s"] for r in ok]) * scale
    tpot = np.array([(r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
                     for r in ok if r["output_tokens"] > 1]) * scale
    return np.concatenate([np.percentile(ttft, [50, 90, 99]), np.percentile(tpot, [50, 90, 99])]) * 1e3


def sim_rows(table: pa.Table, results: Path, name: str) -> list[dict]:
    with RunStore(results, config={}, backend="sim", run_id=name) as run:
        simulate(table, ClusterConfig.build(replicas=2), make_policy("least_outstanding"), run)
    return pq.read_table(run.dir / "requests.parquet").to_pylist()


def replay_rows(table: pa.Table, urls: list[str], speed: float, results: Path, name: str) -> list[dict]:
    options = ReplayOptions(time_scale=1 / speed, scrape_s=None)
    pre = preflight(urls, options)
    with RunStore(results, config={}, backend="replay", run_id=name) as run:
        replay(table, urls, make_policy("least_outstanding"), run, options, pre=pre)
    return pq.read_table(run.dir / "requests.parquet").to_pylist()


def line(name: str, f: np.ndarray, ref: np.ndarray | None = None) -> str:
    cells = [f"{v:.1f}" if k < 3 else f"{v:.2f}" for k, v in enumerate(f)]
    if ref is not None:
        cells = [f"{c} ({100 * (v / r - 1):+.1f}%)" for c, v, r in zip(cells, f, ref)]
    return f"| {name} | " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--speeds", default="1,2,4")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {1})
    table = make_trace(args.requests)
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; {args.requests} requests")
    print("| run | TTFT p50 ms | TTFT p90 | TTFT p99 | TPOT p50 ms | TPOT p90 | TPOT p99 |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp)
        ref = figures(sim_rows(table, results, "sim"), 1.0)
        print(line("simulate", ref), flush=True)
        arrival = table.column("arrival_s").to_numpy()
        column = table.schema.get_field_index("arrival_s")
        for speed in (float(s) for s in args.speeds.split(",")):
            rng = np.random.default_rng(0)
            moved = np.array([figures(sim_rows(table.set_column(column, "arrival_s", pa.array(
                arrival + rng.uniform(0, 0.001 * speed, len(arrival)))), results, f"j{speed}-{k}"), 1.0)
                for k in range(10)])
            lo, hi = moved.min(axis=0), moved.max(axis=0)
            print(f"| simulate, arrivals +{speed:g} ms | " + " | ".join(
                f"{100 * (a / r - 1):+.1f}..{100 * (b / r - 1):+.1f}%" for a, b, r in zip(lo, hi, ref)) + " |")
            for mode, flags in (("client routing", ("--port-per-replica", "0")),
                                ("server routing", ("--port", "0", "--policy", "least_outstanding"))):
                proc, urls = start_server(0, [*CLUSTER, *flags, "--speed", str(speed)])
                try:
                    rows = replay_rows(table, urls, speed, results, f"{mode[:6]}{speed}")
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
                print(line(f"serve x{speed:g}, {mode}", figures(rows, speed), ref), flush=True)


if __name__ == "__main__":
    main()
