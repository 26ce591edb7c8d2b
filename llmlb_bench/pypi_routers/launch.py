"""Starting a PyPI router as a subprocess on loopback, waiting until it routes, and reading its CPU.

Why these flags: sglang-router and smg bind 0.0.0.0 by default and answer before their workers are
registered, so every router gets ``--host 127.0.0.1`` and ``--prometheus-host 127.0.0.1`` and we
wait for ``/readiness`` (200 only once a worker is healthy). CPU per request is the router
process's own user + system time from ``/proc`` (all its threads, and any children), read before
and after a run, so nothing is added to the router's path.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from llmlb_bench.errors import UserError
from llmlb_bench.pypi_routers.identity import worker_counts
from llmlb_bench.pypi_routers.install import ensure

#: the name under which ``llmlb route`` stands beside the PyPI routers
LLMLB_ROUTE = "llmlb-route"

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free at the moment of the call."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (0 for a gone process)."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


class RouterProcess:
    """One router in front of ``workers`` (a PyPI router, or :data:`LLMLB_ROUTE`); ``url`` is where
    clients send requests."""

    def __init__(self, name: str, policy: str, workers: list[str], log: Path,
                 extra: list[str] | None = None, debug_log: bool = False, cpus: str | None = None) -> None:
        self.name = name
        self.policy = policy
        self.workers = workers
        self.log = log
        port, prom = free_ports(2)
        self.url = f"http://127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{prom}/metrics"
        if name == LLMLB_ROUTE:  # llmlb's own proxy, side by side with the Rust routers
            argv = [sys.executable, "-m", "llmlb_bench", "route", *[a for w in workers for a in ("-b", w)],
                    "--policy", policy, "--port", str(port), "--results", str(log.with_suffix(".runs")),
                    *(extra or [])]
        else:
            argv = [*ensure(name), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
                    "--policy", policy, "--prometheus-port", str(prom), "--prometheus-host", "127.0.0.1",
                    "--log-level", "debug" if debug_log else "error", *(extra or [])]
        if cpus:
            argv = ["taskset", "-c", cpus, *argv]
        self.argv = argv
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log_fh = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env={**os.environ, "NO_COLOR": "1"})

    def wait_ready(self, timeout_s: float = 30.0) -> "RouterProcess":
        """Block until ``/readiness`` answers 200 (a worker is registered and healthy)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise UserError(f"{self.name} exited with code {self.proc.returncode}: {self._last_line()}",
                                str(self.log))
            if _status(self.url + "/readiness") == 200:
                return self
            time.sleep(0.1)
        self.stop()
        raise UserError(f"{self.name} not ready after {timeout_s:.0f} s: {self._last_line()}", str(self.log))

    def _last_line(self) -> str:
        self._log_fh.flush()
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return lines[-1][-200:] if lines else "no output"

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def worker_counts(self) -> dict[str, float]:
        """The router's own requests per worker (:func:`identity.worker_counts`); {} without them."""
        if self.name == LLMLB_ROUTE:
            return {}
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
                return worker_counts(r.read().decode(errors="replace"))
        except OSError:
            return {}

    def stop(self) -> None:
        """SIGTERM to the router's process group, SIGKILL after 5 s; idempotent."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self._log_fh.close()

    def __enter__(self) -> "RouterProcess":
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()
