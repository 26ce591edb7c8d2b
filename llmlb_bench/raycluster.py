"""Ray start-up, shared by the sweep's Ray executor and the replayer's Ray workers.

Without an address a private local instance is started (with the package on
every worker's ``PYTHONPATH``) and stopped afterwards; with one (``auto``,
``host:port``, ``ray://host:10001``) a running cluster is joined and left
running. A process that already initialised Ray keeps its session.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from llmlb_bench.errors import UserError


def start_ray(address: str | None, workers: int | None) -> Any:
    """Initialise Ray (see the module docstring); returns the ``ray`` module. ``workers``: CPUs of a
    private instance."""
    try:
        import ray
    except ImportError:
        raise UserError("Ray is not installed; install the extra: pip install 'llmlb-bench[ray]'",
                        "--executor") from None
    if address is None:
        package_root = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        ray.init(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    else:
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserError(f"cannot connect to Ray at {address!r}: {str(exc).splitlines()[0]}",
                            "--address") from None
    return ray


@contextmanager
def ray_session(address: str | None, workers: int | None) -> Iterator[Any]:
    """Ray for the length of a ``with`` block: the session this process already has, or one started
    (and shut down at the end) by :func:`start_ray`."""
    try:
        import ray
    except ImportError:
        ray = None  # type: ignore[assignment]  # Ray is an optional extra
    if ray is not None and ray.is_initialized():
        yield ray
        return
    ray = start_ray(address, workers)
    try:
        yield ray
    finally:
        if ray.is_initialized():
            ray.shutdown()
