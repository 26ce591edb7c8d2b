"""A trained policy deployed as ``llmlb route`` (a real process) and audited: every decision it took
in deployment is recomputed offline from the observation it logged, with the policy file alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import pyarrow.parquet as pq

from llmlb_bench.policies.learned import LearnedPolicy
from llmlb_bench.pypi_routers.launch import free_ports

ROOT = Path(__file__).resolve().parents[1]


def route_with_policy(backends: list[str], policy_file: Path, folder: Path, send: Callable[[str, int], None],
                      n: int, concurrency: int = 4, timeout_s: float = 600.0) -> tuple[list[dict[str, Any]], Path]:
    """Start ``llmlb route -p learned`` over ``backends``, call ``send(url, i)`` for i < n from
    ``concurrency`` threads, stop it with SIGTERM (it drains); returns its rows and its decision log."""
    port = free_ports(1)[0]
    log = folder / "decisions.jsonl"
    args = [sys.executable, "-m", "llmlb_bench", "route", "--port", str(port), "--results", str(folder),
            "--run-id", "route", "-p", "learned", "--policy-arg", f"path={policy_file}", "--policy-arg",
            f"log={log}", "--scrape-interval", "0.2"]
    for b in backends:
        args += ["-b", b]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        assert "route http://127.0.0.1:" in first, first
        url = f"http://127.0.0.1:{port}"
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda i: send(url, i), range(n)))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout_s) == 0, proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    rows = sorted(pq.read_table(folder / "route" / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
    return rows, log


def audit(policy_file: Path, log: Path, rows: list[dict[str, Any]], backends: list[str]) -> list[dict[str, Any]]:
    """Check each logged decision: the file's model on the logged observation picks the logged
    target, and the request's row went to that backend. Returns the decisions."""
    policy = LearnedPolicy(str(policy_file))
    decisions = [json.loads(line) for line in log.read_text().splitlines()]
    by_id = {r["request_id"]: r for r in rows}
    import numpy as np

    for d in decisions:
        scores = policy.score_features(np.asarray(d["targets"]), np.asarray(d["request"]))
        assert policy.pick(scores, d["healthy"], d["tie"]) == d["target"], d
        assert by_id[d["request_id"]]["target"] == backends[d["target"]], d
    return decisions
