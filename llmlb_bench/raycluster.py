"""Ray start-up, shared by the sweep's Ray executor and the replayer's Ray workers.

Without an address a private local instance is started (with the package on
every worker's ``PYTHONPATH``) and stopped afterwards; with one (``auto``,
``host:port``, ``ray://host:10001``) a running cluster is joined and left
running. A process that already initialised Ray keeps its session.

An address is checked before anything else happens (:func:`check_address`):
``ray.init`` given an address where nothing listens keeps retrying, so
``llmlb replay --address 127.0.0.1:1`` hung with its results folder already
created; a refused TCP connection is known at once.
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator

from llmlb_bench.errors import UserError

#: how long the TCP check of a cluster address waits for an answer (a refusal is immediate; this bounds
#: a host that drops the connection attempt)
CONNECT_TIMEOUT_S = 10.0


def _import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise UserError("Ray is not installed; install the extra: pip install 'llmlb-bench[ray]'",
                        "--executor") from None
    return ray


def check_address(address: str) -> None:
    """Fail fast, with one line on ``--address``, when no Ray cluster can be at ``address``: ``auto``
    that finds none, or a ``host:port`` (``ray://host:port``) where nothing accepts a TCP connection.
    ``auto`` and an empty address read ``RAY_ADDRESS`` and the running Ray processes as ``ray.init``
    does. A port that accepts connections but is not Ray's is found only by ``ray.init``."""
    _import_ray()
    from ray._private.services import canonicalize_bootstrap_address

    if address.startswith("ray://"):
        target = address[len("ray://"):]
    else:
        try:
            target = canonicalize_bootstrap_address(address) or ""
        except (ConnectionError, ValueError) as exc:
            raise UserError(f"cannot connect to Ray at {address!r}: {str(exc).splitlines()[0]}", "--address") from None
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except ValueError:
        raise UserError(f"cannot connect to Ray at {address!r}: not host:port", "--address") from None
    except OSError as exc:
        where = address if target == address else f"{address} ({target})"
        raise UserError(f"cannot connect to Ray at {where}: {exc.strerror or exc}", "--address") from None


def start_ray(address: str | None, workers: int | None) -> ModuleType:
    """Initialise Ray (see the module docstring); returns the ``ray`` module. ``workers``: CPUs of a
    private instance."""
    ray = _import_ray()
    if address is None:
        package_root = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        ray.init(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    else:
        check_address(address)
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserError(f"cannot connect to Ray at {address!r}: {str(exc).splitlines()[0]}",
                            "--address") from None
    return ray


@contextmanager
def ray_session(address: str | None, workers: int | None) -> Iterator[ModuleType]:
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
