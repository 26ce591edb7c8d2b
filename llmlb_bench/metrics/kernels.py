"""The report's compiled kernels (``report_kernels.c``), where the compiled core is built and fresh.

The pacing walks, the streams' layout, the sorts behind ITL's sample and the slowest-10% gap mean, and
the fairness windows' cells (:mod:`llmlb_bench.metrics.pacing`, :mod:`llmlb_bench.metrics.distribution`,
:mod:`llmlb_bench.metrics.fairness`) each have a NumPy path,
the reference, and a C kernel that computes the same floating-point operations in the same order in
one pass, so the two give every figure to the last bit (tests/test_report_kernels.py). The kernel
module is built by ``setup.py`` with the simulator's compiled core and loaded by the core's finder
only while the core's sources, the kernel's C source among them, are those it was built from
(:mod:`llmlb_bench.compiled_core`): ``LLMLB_CORE=python``, no compiler or a stale build leave the
NumPy paths. :data:`native` is read at each call, so a test sets it to None for the NumPy path.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def load(name: str) -> ModuleType | None:
    """The kernel module ``llmlb_bench.metrics.<name>`` where the compiled core is built and fresh,
    else None (its caller's NumPy path runs)."""
    try:
        return importlib.import_module(f"llmlb_bench.metrics.{name}")
    except ImportError:
        return None


#: the report's kernel module, or None: the callers' NumPy paths run
native: ModuleType | None = load("report_kernels")
