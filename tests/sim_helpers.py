"""Helpers shared by the simulator tests: build traces, run the simulator into a real RunStore."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.policies import make_policy
from llmlb_bench.schema import trace_table
from llmlb_bench.sim import ClusterConfig, simulate
from llmlb_bench.store import RunStore


def trace(arrival: np.ndarray, input_tokens: Any, output_tokens: Any, **extra: Any) -> pa.Table:
    """A TRACE table; scalar lengths are broadcast."""
    return trace_table(arrival, input_tokens, output_tokens, "test", **extra)


def poisson_trace(n: int, rate: float, seed: int = 0, input_mean: float = 600, output_mean: float = 150) -> pa.Table:
    """Poisson arrivals with lognormal lengths (a small chat-like workload)."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    inp = np.clip(rng.lognormal(np.log(input_mean), 0.8, n), 1, 6000).astype(np.int32)
    out = np.clip(rng.lognormal(np.log(output_mean), 0.8, n), 1, 2000).astype(np.int32)
    return trace(arrival, inp, out)


def run_sim(tmp_path: Path, table: pa.Table, cfg: ClusterConfig, policy: str = "least_outstanding",
            seed: int = 0, run_id: str = "sim", args: dict[str, Any] | None = None,
            ) -> tuple[pa.Table, pa.Table, dict[str, Any]]:
    """Simulate into ``tmp_path/run_id``; returns (requests, series, summary)."""
    with RunStore(tmp_path, config={"cluster": cfg.to_dict()}, backend="sim", run_id=run_id) as run:
        summary = simulate(table, cfg, make_policy(policy, args), run, seed=seed)
    return (pq.read_table(run.dir / "requests.parquet"), pq.read_table(run.dir / "series.parquet"), summary)


def by_request_id(table: pa.Table) -> pa.Table:
    import pyarrow.compute as pc

    return table.take(pc.sort_indices(table, [("request_id", "ascending")]))


#: An A100-like GPU with little memory left for KV cache (~585 blocks for Llama-3-8B), so
#: requests get preempted; write it to a .toml file and pass it in ClusterConfig.catalogs.
TINY_GPU = """
[gpus.tiny-gpu]
description = "A100 with 18 GiB: a KV cache of ~585 blocks for Llama-3-8B, so requests get preempted"
memory_gib = 18
bf16_tflops = 312
hbm_gb_s = 2039
link_gb_s = 300
link_latency_us = 8
idle_w = 55
max_w = 400
price_per_hour = 1.0
compute_efficiency = 0.6
memory_efficiency = 0.8
step_overhead_ms = 2.0
layer_latency_us = 40
memory_power_fraction = 0.6
"""


def learned_policy_file(folder: Path, weights: dict[str, float] | None = None) -> Path:
    """A linear policy file over the default features (``weights``: per-target field -> weight;
    default: minus the own in-flight count, i.e. join the shortest queue)."""
    import json

    from llmlb_bench.policies.features import Features
    from llmlb_bench.policies.learned import n_params, policy_document, unflatten

    f = Features()
    n_in = len(f.target_names) + len(f.request_names)
    v = np.zeros(n_params(n_in, []))
    for name, w in (weights or {"outstanding_requests": -1.0}).items():
        v[f.target_names.index(name)] = w
    doc = policy_document(f.layout(), unflatten(v, n_in, []), objective={"name": "test"}, training={})
    path = folder / "policy.json"
    path.write_text(json.dumps(doc))
    return path


def builtin_args(name: str, folder: Path) -> dict[str, Any]:
    """Arguments a built-in policy cannot run without (the learned policy's file)."""
    return {"path": str(learned_policy_file(folder))} if name == "learned" else {}


def in_pure_python(request: Any) -> bool:
    """For a test that hooks into the replica by monkeypatching its methods: mypyc's compiled classes
    are closed, so under the compiled core (llmlb_bench/compiled_core.py) the test runs again in a
    subprocess with ``LLMLB_CORE=python``, and its outcome is asserted here. Returns True when that
    happened (the caller then returns); False where this process runs the pure-Python replica.
    Both cores give the same rows bit for bit (tests/test_compiled_core.py), so what the hooks
    check holds for both."""
    import os
    import subprocess
    import sys

    from llmlb_bench import compiled_core

    if "llmlb_bench.sim.replica" not in compiled_core.MODULES or not compiled_core.current().compiled:
        return False
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
                          cwd=request.config.rootpath, env={**os.environ, "LLMLB_CORE": "python"},
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1], done.stdout[-2000:]
    return True
