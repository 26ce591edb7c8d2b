"""Speed of the routing environment against the plain simulator on the same trace.

The environment (llmlb_bench/learn/env.py) pays, per routing decision, two
greenlet switches, the observation (policies/features.py, padded into the
Dict space), the reward of each ended request and its Outcome. This runs, on
one generated trace and interleaved ``--repeats`` times:

* ``simulate``: ``sim.simulation.simulate`` with ``round_robin`` (what ``llmlb
  simulate`` runs, without the Parquet writing);
* ``env``: one episode of ``RouteEnv`` on the same trace with an agent that
  answers round robin from the step counter (the same decisions, so the same
  simulated work), default observation (every feature);
* ``env, 1 field``: the same with the observation cut to one per-target field,
  so the difference to ``env`` is the cost of the features;

and prints CPU seconds (``time.process_time``, less sensitive to other
processes than wall time) per request: median and range over the repeats, and
the env / simulate ratio per repeat (median, range). Also the cost of one
greenlet switch pair on its own.

    python benchmarks/env_speed.py [--workload chat] [--requests 5000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

from greenlet import getcurrent, greenlet

from llmlb_bench.learn.env import RouteEnv
from llmlb_bench.policies import make_policy
from llmlb_bench.sim.simulation import simulate


class _Drop:
    def write(self, columns: Any) -> None:
        return None


class _Run:
    requests = series = _Drop()


def plain(env: RouteEnv, seed: int) -> float:
    trace, sim_seed = env.episodes.trace(seed)
    start = time.process_time()
    simulate(trace, env.cluster, make_policy("round_robin"), _Run(), seed=sim_seed)
    return time.process_time() - start


def episode(env: RouteEnv, seed: int) -> float:
    """CPU seconds of reset (without generating the trace) + every step."""
    n = env.actions.max_targets
    trace = env.episodes.trace(seed)
    episodes, env.episodes.trace = env.episodes.trace, lambda s: trace   # time the simulation, not generation
    try:
        start = time.process_time()
        env.reset(seed=seed)
        k = 0
        while True:
            *_, term, _, _ = env.step(k % n)
            k += 1
            if term:
                return time.process_time() - start
    finally:
        env.episodes.trace = episodes


def switch_pair_us(n: int = 200_000) -> float:
    """One switch into a greenlet and back, in microseconds of CPU time."""
    main = getcurrent()

    def loop() -> None:
        while True:
            main.switch(None)

    g = greenlet(loop)
    g.switch()
    start = time.process_time()
    for _ in range(n):
        g.switch()
    return (time.process_time() - start) / n * 1e6


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f}  [{min(values):.1f} .. {max(values):.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="chat")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    full = RouteEnv(a.workload, requests=a.requests, reward="neg_latency", slo=None)
    slim = RouteEnv(a.workload, requests=a.requests, reward="neg_latency", slo=None, fields=["healthy"])
    runs: dict[str, Callable[[], float]] = {"simulate": lambda: plain(full, a.seed),
                                            "env": lambda: episode(full, a.seed),
                                            "env, 1 field": lambda: episode(slim, a.seed)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(a.repeats):
        for name, run in runs.items():
            times[name].append(run() / a.requests * 1e6)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"{a.workload}, {a.requests} requests, {full.actions.max_targets} targets, {a.repeats} repeats; "
          f"load average {' '.join(load)}")
    print(f"{'':14s} us CPU per request: median  [range]")
    for name, values in times.items():
        print(f"{name:14s} {summary(values)}")
    for name in ("env", "env, 1 field"):
        ratios = [e / s for e, s in zip(times[name], times["simulate"])]
        print(f"{name} / simulate: {statistics.median(ratios):.2f}  [{min(ratios):.2f} .. {max(ratios):.2f}]")
    print(f"greenlet switch pair: {switch_pair_us():.2f} us")


if __name__ == "__main__":
    main()
