"""Workloads: generate traces from specs, import real traces, characterise and fit them.

Public API::

    from llmlb_bench.workload import load_spec, generate
    spec = load_spec("workloads/chat.toml")
    table = generate(spec, seed=None, rate_scale=1.0)   # a schema.TRACE table
"""

from llmlb_bench.workload.generate import generate
from llmlb_bench.workload.spec import TenantSpec, WorkloadSpec, load_spec

__all__ = ["TenantSpec", "WorkloadSpec", "generate", "load_spec"]
