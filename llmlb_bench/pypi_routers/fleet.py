"""Backends for router scenarios: one ``llmlb serve`` process per backend, each on a fixed port.

Why processes, not servers on a thread: the replayer's event loop runs in the bench process, and
backends sharing its interpreter would share its GIL and show up in every latency figure. Fixed
ports let a killed backend come back under the same URL (the router knows it by that URL) and keep
URLs equal across the runs of one scenario, so decisions can be compared request by request.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

from llmlb_bench.errors import UserError


class Backend:
    """One ``llmlb serve --replicas 1`` process; :meth:`kill` is SIGKILL (a crash, not a drain)."""

    def __init__(self, port: int, speed: float, seed: int, model: str = "llama-3-8b") -> None:
        self.port, self.speed, self.seed, self.model = port, speed, seed, model
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, wait: bool = True) -> "Backend":
        argv = [sys.executable, "-m", "llmlb_bench", "serve", "--replicas", "1", "--model", self.model,
                "--port-per-replica", str(self.port), "--speed", str(self.speed), "--seed", str(self.seed)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                err = (self.proc.stderr.read() if self.proc.stderr else b"").decode(errors="replace").strip()
                raise UserError(f"llmlb serve on port {self.port} exited: {err.splitlines()[-1:] or 'no output'}",
                                "backend")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise UserError(f"llmlb serve on port {self.port} not ready after {timeout_s:.0f} s", "backend")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
