"""What the engine launchers share about their server processes: stopping a process group, dying
with the process that started it, asking whether a URL answers, and a log's tail for an error.

Each launcher (vllm.py, transformers_serve.py) starts its server in a session of its own, so that a
signal to the group reaches the server's own children too (vLLM's engine core and workers)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import urllib.request
from typing import IO


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """``sig`` to ``proc``'s process group (started with ``start_new_session``); gone is fine."""
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the server's pid
    except ProcessLookupError:
        pass


def die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the process that started it dies, so a killed
    test run or CLI leaves no server behind (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def answers(url: str) -> str | None:
    """The body of a 200 answer from ``url`` (vLLM's /health has an empty one), or None (not up yet)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read().decode(errors="replace") if r.status == 200 else None
    except OSError:
        return None


def log_tail(log: IO[bytes], chars: int = 3000) -> str:
    """The last ``chars`` of a server's log file (open for writing), for an error message."""
    log.flush()
    with open(log.fileno(), "rb", closefd=False) as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - chars))
        return f.read().decode(errors="replace")
