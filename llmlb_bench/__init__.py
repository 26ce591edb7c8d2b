"""llmlb-bench: benchmarking and workload replay for load balancing in LLM inference serving."""

__version__ = "0.1.0"
