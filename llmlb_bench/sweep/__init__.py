"""Sweeps: grids of simulated runs over rate x policy x cluster x workload x seed, stability
curves with their knees, and capacity search, on a local process pool or a Ray cluster.

    from llmlb_bench.sweep import load_sweep, make_executor, run_sweep
    spec = load_sweep("sweeps/policies.toml")
    with make_executor("local") as ex:
        outcome = run_sweep(spec, "results", ex)
    outcome.curves, outcome.capacity      # also in results/<name>/summary.json

See docs/sweeps.md.
"""

from llmlb_bench.sweep.executors import EXECUTORS, Executor, LocalExecutor, RayExecutor, make_executor
from llmlb_bench.metrics.knee import kneedle
from llmlb_bench.sweep.runner import Progress, SweepOutcome, run_sweep
from llmlb_bench.sweep.spec import SweepSpec, load_sweep, parse_sweep

__all__ = ["EXECUTORS", "Executor", "LocalExecutor", "Progress", "RayExecutor", "SweepOutcome", "SweepSpec",
           "kneedle", "load_sweep", "make_executor", "parse_sweep", "run_sweep"]
