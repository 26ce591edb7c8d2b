"""The built-in cluster simulator: replicas running vLLM v1-style continuous batching
with a paged KV cache and a roofline cost model, driven by a trace and a routing policy.

    from llmlb_bench.sim import ClusterConfig, simulate, load_catalog
    summary = simulate(trace, ClusterConfig.build(replicas=4, gpu="h100-sxm"), policy, run, seed=0)

See docs/simulator.md for the model, its assumptions and its validation.
"""

from llmlb_bench.sim.catalog import GPU, Catalog, Model, load_catalog
from llmlb_bench.sim.config import ClusterConfig, PoolConfig, load_cluster
from llmlb_bench.sim.cost import CostModel
from llmlb_bench.sim.simulation import simulate

__all__ = ["GPU", "Catalog", "ClusterConfig", "CostModel", "Model", "PoolConfig", "load_catalog", "load_cluster",
           "simulate"]
