"""Print the simulator's queueing-theory validation figures (the table in docs/simulator.md).

    python benchmarks/sim_validation.py [--requests 100000] [--runs 5]

For each case, each run simulates ``--requests`` requests (independent seeds) and prints
the mean wait against theory: per-run relative errors and the error of their average.
* M/D/1: one replica, max_num_seqs = 1, fixed 100-token prompts and 10-token outputs.
* M/M/1: one replica, max_num_seqs = 1, 1-token prompts, geometric outputs (mean 100).
* M/M/c: 4 replicas behind a router-side FCFS queue (fcfs_queue, max_outstanding = 1).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile

import numpy as np
import pyarrow.parquet as pq

from llmlb_bench.policies import make_policy
from llmlb_bench.schema import TRACE
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.sim.fleet import cost_model
from llmlb_bench.store import RunStore


def _poisson(n: int, mean_gap: float, seed: int) -> np.ndarray:
    gaps = np.random.default_rng(seed).exponential(1.0, n)
    return np.cumsum(gaps / gaps.mean() * mean_gap)


def _run(arrival: np.ndarray, prompt, output, cfg: ClusterConfig, policy: str, args: dict) -> np.ndarray:
    import pyarrow as pa

    n = len(arrival)
    table = TRACE.conform(pa.table({
        "request_id": np.arange(n), "arrival_s": arrival,
        "input_tokens": np.broadcast_to(np.asarray(prompt, dtype=np.int32), (n,)).copy(),
        "output_tokens": np.broadcast_to(np.asarray(output, dtype=np.int32), (n,)).copy()}), "bench")
    with tempfile.TemporaryDirectory() as d:
        with RunStore(d, config={}, backend="sim", label="validate") as run:
            simulate(table, cfg, make_policy(policy, args), run)
        req = pq.read_table(run.dir / "requests.parquet").sort_by("request_id")
    return req.column("last_token_s").to_numpy() - arrival


def _service(cfg: ClusterConfig) -> np.ndarray:
    """Service time of a lone 1-token-prompt request by output length (index), from the cost model."""
    cost = cost_model(cfg.pools[0])
    prefill = cost.step(1, 1.0, 1, 0, 0, 1).total
    decode = [cost.decode_time(1, j + 2) for j in range(3000)]
    return np.concatenate([[0.0], prefill + np.concatenate([[0.0], np.cumsum(decode)])[:2999]])


def _report(name: str, rho: float, waits: list[float], theory: float) -> None:
    errs = [100 * (w / theory - 1) for w in waits]
    print(f"| {name} | {rho} | {theory:.4f} s | {np.mean(waits):.4f} s | {100 * (np.mean(waits) / theory - 1):+.2f}% "
          f"| {', '.join(f'{e:+.1f}%' for e in errs)} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    n, runs = a.requests, a.runs
    print(f"{runs} runs of {n:,} requests each\n")
    print("| queue | load | theory mean wait | simulated (average of runs) | error of average | per-run errors |")
    print("|---|---|---|---|---|---|")
    md1 = ClusterConfig.build(replicas=1, max_num_seqs=1)
    d = float(_run(np.array([0.0]), 100, 10, md1, "round_robin", {})[0])
    for rho in (0.5, 0.8, 0.9):
        waits = [float(np.mean(_run(_poisson(n, d / rho, s), 100, 10, md1, "round_robin", {}) - d))
                 for s in range(runs)]
        _report("M/D/1", rho, waits, rho * d / (2 * (1 - rho)))
    svc = _service(md1)
    for rho in (0.5, 0.8):
        waits, theory = [], []
        for s in range(runs):
            out = np.minimum(np.random.default_rng(s).geometric(0.01, n), 2999)
            st = svc[out]
            waits.append(float(np.mean(_run(_poisson(n, st.mean() / rho, 1000 + s), 1, out, md1, "round_robin", {})
                                       - st)))
            theory.append(rho / st.mean() * (st ** 2).mean() / (2 * (1 - rho)))
        _report("M/M/1 (P-K, Cs^2 = 0.99)", rho, waits, float(np.mean(theory)))
    c = 4
    mmc = ClusterConfig.build(replicas=c, max_num_seqs=1)
    for rho in (0.7,):
        waits, means = [], []
        for s in range(runs):
            out = np.minimum(np.random.default_rng(s).geometric(0.01, n), 2999)
            st = svc[out]
            waits.append(float(np.mean(_run(_poisson(n, st.mean() / (c * rho), 2000 + s), 1, out, mmc, "fcfs_queue",
                                            {"max_outstanding": 1}) - st)))
            means.append(st.mean())
        a_ = c * rho
        top = a_ ** c / math.factorial(c) / (1 - rho)
        p_wait = top / (sum(a_ ** k / math.factorial(k) for k in range(c)) + top)
        _report(f"M/M/{c} (Erlang C, central FCFS)", rho, waits, p_wait * float(np.mean(means)) / (c * (1 - rho)))


if __name__ == "__main__":
    sys.exit(main())
