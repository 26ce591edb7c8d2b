"""Ctrl-C, however often, ends a run cleanly (docs/security.md): no traceback, the partial run kept
and named, run.json written whole; a run refused before it starts leaves nothing behind.

Real processes and real signals: ``llmlb simulate`` and ``llmlb replay`` get three SIGINTs 50 ms
apart once their first rows are on disk (a user hammering Ctrl-C; the second and third land in the
cleanup and in the exit callbacks, where they used to print a traceback).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import make_trace
from test_crash_kill import LLMLB, big_trace
from llmlb_bench.replay.selfcheck import noop_server
from llmlb_bench.schema import write_trace
from llmlb_bench.store.parts import table_files

pytestmark = pytest.mark.slow



def _three_ctrl_c(proc: subprocess.Popen, run_dir, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while not table_files(run_dir / "requests.parquet"):
        assert proc.poll() is None and time.monotonic() < deadline, "no rows were written"
        time.sleep(0.05)
    for _ in range(3):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err  # not -SIGINT: a late Ctrl-C used to kill it during the exit
    assert "Traceback" not in err and "Exception ignored" not in err, err
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "partial" and meta["reason"] == "interrupted"
    return err


def test_simulate_interrupted_three_times(tmp_path):
    big_trace(tmp_path)
    proc = subprocess.Popen(LLMLB + ["simulate", str(tmp_path / "t.parquet"), "-r", str(tmp_path / "res"),
                                     "--run-id", "s"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = _three_ctrl_c(proc, tmp_path / "res" / "s")
    assert f"partial run (requests simulated so far) is kept in {tmp_path / 'res' / 's'}" in err.replace("\n", "")


@pytest.fixture
def noop():
    with noop_server(itl_ms=50.0) as url:
        yield url


def test_replay_interrupted_three_times(tmp_path, noop):
    write_trace(make_trace(n=400, rate=40.0, output_tokens=10), tmp_path / "t.parquet")
    proc = subprocess.Popen(LLMLB + ["replay", str(tmp_path / "t.parquet"), "-e", noop, "-r", str(tmp_path / "res"),
                                     "--run-id", "k", "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = _three_ctrl_c(proc, tmp_path / "res" / "k")
    assert "continue it with --resume" in err


def test_ray_without_a_cluster_leaves_no_run_behind(tmp_path, noop, monkeypatch):
    pytest.importorskip("ray")
    write_trace(make_trace(n=4), tmp_path / "t.parquet")
    env = {**os.environ, "RAY_TMPDIR": str(tmp_path / "ray")}  # no cluster that 'auto' could find
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(LLMLB + ["replay", str(tmp_path / "t.parquet"), "-e", noop, "--workers", "2", "--executor",
                                  "ray", "--address", "auto", "-r", str(tmp_path / "res"), "--no-progress"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and out.stderr.startswith("error: --address:"), out.stderr
    assert not (tmp_path / "res").exists()
