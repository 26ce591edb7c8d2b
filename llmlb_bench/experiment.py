"""One simulated run end to end: trace + cluster + policy -> a stored run.

Shared by ``llmlb simulate`` and ``llmlb run`` (and later sweeps), so the
run.json of every simulated run records the same reproduction recipe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa

from llmlb_bench.policies import make_policy
from llmlb_bench.schema import trace_spec
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore


def simulate_run(trace: pa.Table, trace_path: Path, cluster: ClusterConfig, policy: str,
                 policy_args: Mapping[str, Any], seed: int, results: Path,
                 label: str | None = None, run_id: str | None = None,
                 sweep: Mapping[str, Any] | None = None) -> RunStore:
    """Simulate ``trace`` under ``policy`` and store it; returns the closed run.

    ``sweep``: the run's coordinates in a sweep, kept in run.json as ``config.sweep``
    so queries can group a sweep's runs by workload, cluster, policy, rate and seed.
    """
    pol = make_policy(policy, policy_args, seed=seed)  # repeats with other seeds re-draw randomised choices
    config = {
        "cluster": cluster.to_dict(),
        "policy": {"name": policy, "args": dict(policy_args)},
        "seed": seed,
    }
    if sweep is not None:
        config["sweep"] = dict(sweep)
    store = RunStore(results, config=config, backend="sim", label=label or policy, run_id=run_id,
                     trace_path=trace_path, trace_rows=trace.num_rows, trace_spec=trace_spec(trace))
    with store as run:
        run.summary.update(simulate(trace, cluster, pol, run, seed=seed))
    return store
