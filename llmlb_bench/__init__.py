"""llmlb-bench: benchmarking and workload replay for load balancing in LLM inference serving."""

from llmlb_bench.compiled_core import install as _install_core

__version__ = "0.1.0"

_install_core()  # the simulator's compiled core, where it is built and fresh (compiled_core.py)
