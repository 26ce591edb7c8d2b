"""Where sweep tasks run: a local process pool (default) or a Ray cluster.

Both run the same module-level functions on the same picklable task
objects and hand results back as tasks finish, so a sweep's results do not
depend on the executor: every task is deterministic in its inputs, and
nothing about a worker (its process, its host, the order tasks finish in)
reaches a task.

The local pool uses the ``spawn`` start method: workers import the package
afresh instead of inheriting a forked copy of the parent (its threads, its
open DuckDB connections, a half-drawn progress bar), and it behaves the same
on Linux, macOS and Windows.

With Ray every worker must be able to import llmlb_bench and must see the
results folder at the same path: on one machine that holds by itself; on a
multi-node cluster install the package on every node and put ``--results``
on a shared file system.
"""

from __future__ import annotations

import multiprocessing
import os
from abc import ABC, abstractmethod
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterable, Iterator, TypeVar

from llmlb_bench.errors import UserError
from llmlb_bench.raycluster import start_ray
from llmlb_bench.tomlfile import unknown_choice

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("local", "ray")


class Executor(ABC):
    """Runs ``fn(task, *args)`` for many tasks and yields ``(task, result)`` as each finishes."""

    workers: int

    @abstractmethod
    def run(self, fn: Callable[..., R], tasks: Iterable[T], *args: Any) -> Iterator[tuple[T, R]]: ...
    # Any: ``fn(task, *args)`` for a task of T and any further arguments, which Python's typing cannot
    # say (a ParamSpec cannot have one positional parameter taken out in front)

    def close(self) -> None:  # noqa: B027  (not abstract: nothing to release is a valid default)
        """Release workers (idempotent)."""

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalExecutor(Executor):
    """A pool of ``workers`` processes on this machine (default: one per CPU)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None

    def run(self, fn: Callable[..., R], tasks: Iterable[T], *args: Any) -> Iterator[tuple[T, R]]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        pending: dict[Future[R], T] = {self._pool.submit(fn, t, *args): t for t in tasks}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    yield pending.pop(fut), fut.result()
        finally:
            for fut in pending:
                fut.cancel()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class RayExecutor(Executor):
    """Tasks as Ray remote functions (one CPU each) on a cluster at ``address``, or on a local instance.

    Without ``address`` a private local Ray instance with ``workers`` CPUs is
    started and stopped with the executor; with one (``auto``, ``host:port``
    or ``ray://host:10001``) the executor connects to a running cluster and
    leaves it running.
    """

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        self._ray = ray = start_ray(address, workers)
        self._remotes: dict[Callable[..., Any], Any] = {}
        self.workers = int(ray.cluster_resources().get("CPU", 1))

    def run(self, fn: Callable[..., R], tasks: Iterable[T], *args: Any) -> Iterator[tuple[T, R]]:
        ray = self._ray
        remote = self._remotes.get(fn)
        if remote is None:
            remote = self._remotes[fn] = ray.remote(num_cpus=1, max_retries=0)(fn)
        shared = [ray.put(a) for a in args]
        pending = {remote.remote(t, *shared): t for t in tasks}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    task = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayTaskError as exc:
                        # a user's mistake found in a worker stays a one-line UserError
                        if isinstance(exc.cause, UserError):
                            raise exc.cause from None
                        raise
                    yield task, result
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._ray.is_initialized():
            self._ray.shutdown()


def make_executor(name: str, workers: int | None = None, address: str | None = None) -> Executor:
    """The executor called ``name`` (see :data:`EXECUTORS`)."""
    if workers is not None and workers < 1:
        raise UserError("must be >= 1", "--workers")
    if name == "local":
        if address is not None:
            raise UserError("--address needs --executor ray", "--address")
        return LocalExecutor(workers)
    if name == "ray":
        return RayExecutor(address, workers)
    raise unknown_choice("executor", name, EXECUTORS, "--executor")
