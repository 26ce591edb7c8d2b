"""An interrupted sweep resumes: a real ``llmlb sweep`` process group is killed mid-sweep, then rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sweep_helpers import close

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # three real sweeps in subprocesses (about 20 s)

SWEEP = """
name = "resume"
slo = "ttft=300ms,tpot=40ms"
seeds = [1, 2]

[workloads]
chat = {{ spec = "{workload}", requests = 600 }}

[clusters]
two = {{ replicas = 2 }}

[policies]
round_robin = {{}}
least_outstanding = {{}}
p2c = {{ policy = "power_of_d", args = {{ d = 2 }} }}

[load]
rate_scale = [0.2, 0.3, 0.4, 0.5, 0.6]
"""


def _sweep_cmd(sweep: Path, results: Path) -> list[str]:
    return [sys.executable, "-m", "llmlb_bench", "sweep", str(sweep), "-r", str(results), "-j", "1",
            "--format", "json"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _states(root: Path) -> dict[str, str]:
    out = {}
    for meta in root.glob("*/run.json"):
        out[meta.parent.name] = json.loads(meta.read_text())["status"]
    return out


def test_a_killed_sweep_resumes_without_redoing_finished_cells(tmp_path):
    sweep = tmp_path / "resume.toml"
    sweep.write_text(SWEEP.format(workload=(REPO / "workloads" / "chat.toml").as_posix()))
    results = tmp_path / "results"
    root = results / "resume"
    proc = subprocess.Popen(_sweep_cmd(sweep, results), cwd=tmp_path, env=_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600   # generous (a hang's bound, not a speed): the loop ends at 5 cells
    try:
        while sum(s == "complete" for s in _states(root).values()) < 5:
            assert proc.poll() is None, "the sweep ended before it could be interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the CLI and its pool workers, no chance to clean up
        proc.wait()
    before = _states(root)
    done = {r for r, s in before.items() if s == "complete"}
    assert 5 <= len(done) < 30
    kept = {r: (root / r / "run.json").read_bytes() for r in done}

    rerun = subprocess.run(_sweep_cmd(sweep, results), cwd=tmp_path, env=_env(), capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    after = _states(root)
    assert len(after) == 30 and set(after.values()) == {"complete"}
    for r, raw in kept.items():  # finished cells were not run again
        assert (root / r / "run.json").read_bytes() == raw
    summary = json.loads(rerun.stdout)
    assert sum(len(c["points"]) for c in summary["curves"]) == 15

    # the resumed sweep holds exactly what an uninterrupted one does
    fresh = subprocess.run(_sweep_cmd(sweep, tmp_path / "fresh"), cwd=tmp_path, env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    for r in after:
        a = pq.read_table(root / r / "requests.parquet")
        b = pq.read_table(tmp_path / "fresh" / "resume" / r / "requests.parquet")
        assert a.equals(b), r
    assert close(json.loads(fresh.stdout)["curves"], summary["curves"])
