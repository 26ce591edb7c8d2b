"""Ctrl-C, however often, ends a run cleanly (docs/security.md): no traceback, the partial run kept
and named, run.json written whole; a run refused before it starts leaves nothing behind.

Real processes and real signals: ``llmlb simulate`` and ``llmlb replay`` get three SIGINTs 50 ms
apart once their first rows are on disk (a user hammering Ctrl-C; the second and third land in the
cleanup and in the exit callbacks, where they used to print a traceback), and ``simulate`` also once
its run is closed, during the closing report (where DuckDB turned the Ctrl-C into 'Query interrupted'
and a slower machine's Ctrl-Cs ended in exit 0). Waits are counted in the run's own progress (rows
on disk, run.json closed), not seconds, so a slower machine interrupts at the same moments.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import CTRL_C, make_trace
from test_crash_kill import LLMLB, big_trace
from llmlb_bench.replay.selfcheck import noop_server
from llmlb_bench.schema import write_trace
from llmlb_bench.store.parts import table_files

pytestmark = pytest.mark.slow



def _wait(proc: subprocess.Popen, ready, what: str) -> float:
    """Seconds until ``ready()``; no fixed deadline, since a slower machine only takes longer: the
    process ending first fails the test."""
    start = time.monotonic()
    while not ready():
        assert proc.poll() is None, f"the process ended before {what}: {proc.communicate()}"
        time.sleep(0.02)
    return time.monotonic() - start


def _status(run_dir) -> str | None:
    try:
        return json.loads((run_dir / "run.json").read_text())["status"]
    except (OSError, ValueError):  # not written yet (it is replaced atomically, never half-written)
        return None


def _three_ctrl_c(proc: subprocess.Popen, run_dir, moment: str = "run") -> tuple[str, dict]:
    """Three SIGINTs 50 ms apart once the run's first rows are on disk (``run``) or once the run is closed and
    the closing report is being computed (``report``); the process must end with 130, no traceback."""
    if moment == "run":
        took = _wait(proc, lambda: table_files(run_dir / "requests.parquet"), "its first rows were written")
    else:
        took = _wait(proc, lambda: _status(run_dir) not in (None, "running"), "the run was closed")
    for _ in range(3):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    # what is left (closing the sinks, or the rest of the report) is a fraction of what came before
    _, err = proc.communicate(timeout=max(120.0, 10 * took))
    assert proc.returncode == 130, err  # not 0 (a swallowed Ctrl-C), not -SIGINT (a late one killed it)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    meta = json.loads((run_dir / "run.json").read_text())
    return err, meta


@pytest.mark.parametrize("moment", ["run", "report"])
def test_simulate_interrupted_three_times(tmp_path, moment):
    big_trace(tmp_path)
    proc = subprocess.Popen(LLMLB + ["simulate", str(tmp_path / "t.parquet"), "-r", str(tmp_path / "res"),
                                     "--run-id", "s"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            **CTRL_C)
    err, meta = _three_ctrl_c(proc, tmp_path / "res" / "s", moment)
    if meta["status"] == "partial":
        assert moment == "run" and meta["reason"] == "interrupted"
        assert f"partial run (requests simulated so far) is kept in {tmp_path / 'res' / 's'}" in err.replace("\n", "")
    else:  # the Ctrl-Cs landed in the closing report (always so for moment 'report'): the run is whole and kept
        assert meta["status"] == "complete" and "interrupted" in err, (meta["status"], err)


@pytest.fixture
def noop():
    with noop_server(itl_ms=50.0) as url:
        yield url


def test_replay_interrupted_three_times(tmp_path, noop):
    write_trace(make_trace(n=400, rate=40.0, output_tokens=10), tmp_path / "t.parquet")
    proc = subprocess.Popen(LLMLB + ["replay", str(tmp_path / "t.parquet"), "-e", noop, "-r", str(tmp_path / "res"),
                                     "--run-id", "k", "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **CTRL_C)
    err, meta = _three_ctrl_c(proc, tmp_path / "res" / "k")
    assert meta["status"] == "partial" and meta["reason"] == "interrupted"
    assert "continue it with --resume" in err


@pytest.fixture
def closed_port():
    """A port bound by this process on every address and not listening: a connection to it is
    refused (Ray turns 127.0.0.1 into the machine's own address first), and no other process
    (another test's Ray cluster, another user's) can take it while the test runs."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("how", ["host:port", "auto"])
def test_ray_without_a_cluster_leaves_no_run_behind(tmp_path, noop, closed_port, how):
    """No Ray cluster at the address: one line on --address, exit 2, no results folder, at once (not
    after ray.init's retries: it hung on an address where nothing listened). ``auto`` is pointed at
    the closed port through RAY_ADDRESS, which it reads before looking for Ray processes on the
    machine, so a cluster someone else runs here is never joined (it was, by the old ``auto`` test)."""
    pytest.importorskip("ray")
    write_trace(make_trace(n=4), tmp_path / "t.parquet")
    env = {**os.environ, "RAY_ADDRESS": closed_port}
    address = closed_port if how == "host:port" else "auto"
    out = subprocess.run(LLMLB + ["replay", str(tmp_path / "t.parquet"), "-e", noop, "--workers", "2", "--executor",
                                  "ray", "--address", address, "-r", str(tmp_path / "res"), "--no-progress"],
                         capture_output=True, text=True, timeout=300, env=env)   # a hang is the failure
    assert out.returncode == 2 and out.stderr.startswith("error: --address:"), out.stderr
    assert f":{closed_port.split(':')[1]}" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "res").exists()


def test_a_signal_inside_a_finalizer_is_delivered_after_it():
    """A Ctrl-C that lands while an object's ``__del__`` runs (a ParquetWriter collected mid-run, seen
    in CI) cannot raise there: Python prints 'Exception ignored in ...' with a traceback and drops it.
    The handler delivers it again once the finalizer has returned, so the command still stops."""
    code = (
        "import os, signal, sys, time\n"
        "from llmlb_bench.cli.app import _raise_interrupt\n"
        "signal.signal(signal.SIGINT, _raise_interrupt)\n"
        "class W:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        for _ in range(10000): pass\n"
        "try:\n"
        "    W()\n"
        "    time.sleep(60)\n"
        "    print('not interrupted')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "interrupted", proc.stdout + proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
