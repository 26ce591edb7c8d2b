"""Runs survive SIGKILL at random instants (docs/security.md, "crash safety").

Real processes: ``llmlb simulate`` and ``llmlb replay`` (against the no-op
server in its own process) are killed with SIGKILL at seeded random instants
once their first rows are on disk. What was flushed must read back whole
(every part a complete Parquet file, one row per request id), the run must
show as ``killed``, and ``llmlb replay --resume`` must finish the replay with
exactly one row per trace row, keeping the rows that survived unchanged.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import make_trace
from llmlb_bench.replay.rows import WRITER_NICE, RowWriter
from llmlb_bench.replay.selfcheck import noop_server, server_records
from llmlb_bench.schema import REQUESTS, write_trace
from llmlb_bench.store.parts import read_parts, table_files
from llmlb_bench.store.sink import ParquetSink
from llmlb_bench.store.views import Catalog

pytestmark = pytest.mark.slow

LLMLB = [sys.executable, "-m", "llmlb_bench"]
#: kill instants: a random moment (seeded: the same on every run), as a fraction of the run's own
#: interval between part files (simulate: after the second part appears). A part is flushed
#: every second or every 65,536 rows, whichever comes first, so on any machine the kill lands
#: before the rows of one more part are done: rows flushed before it, work left after it
INSTANTS = [round(random.Random(15).uniform(0.0, 1.0), 2) for _ in range(2)]


def _wait_for_part(proc: subprocess.Popen, folder: Path, parts: int = 2, timeout: float = 120.0) -> float:
    """Wait until ``parts`` part files exist; return the seconds between the last two appearing."""
    deadline = time.monotonic() + timeout
    seen: dict[int, float] = {}  # part count -> when it was first seen
    while (n := len(table_files(folder))) < parts:
        assert proc.poll() is None, f"the run ended before its parts appeared: {proc.communicate()}"
        assert time.monotonic() < deadline, "the part files did not appear"
        seen.setdefault(n, time.monotonic())
        time.sleep(0.02)
    # both parts within one poll: the interval is below the poll's
    return time.monotonic() - seen[parts - 1] if parts - 1 in seen else 0.02


def _kill(proc: subprocess.Popen, after_s: float) -> None:
    time.sleep(after_s)
    assert proc.poll() is None, "the run finished before the kill: make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _check_survivors(run_dir: Path, trace_ids: set[int]) -> list[dict]:
    parts = table_files(run_dir / "requests.parquet")
    assert parts and all(pq.ParquetFile(p).metadata.num_rows >= 0 for p in parts)  # every part is whole
    # a kill that lands mid-write leaves that one part's temporary file, which no reader takes as a part
    temporaries = [p for p in (run_dir / "requests.parquet").iterdir() if p.name.startswith(".")]
    assert len(temporaries) <= 1 and not set(temporaries) & set(parts)
    rows = read_parts(run_dir / "requests.parquet", REQUESTS).to_pylist()
    assert pq.read_table(run_dir / "requests.parquet").num_rows == len(rows)
    ids = [r["request_id"] for r in rows]
    assert rows and len(ids) == len(set(ids)) and set(ids) <= trace_ids
    cat = Catalog([run_dir])
    assert cat.query("select status from runs").column(0).to_pylist() == ["killed"]
    assert cat.query("select count(*) from requests").column(0).to_pylist() == [len(rows)]
    return rows


def big_trace(folder: Path, requests: int = 200_000) -> Path:
    """A trace the simulator needs several seconds for (time to interrupt or kill it mid-run)."""
    (folder / "w.toml").write_text(
        f'name = "w"\nseed = 3\nrequests = {requests}\n[tenants.a]\narrival = {{ process = "poisson", rate = 40.0 }}\n'
        'input = { dist = "lognormal", median = 300, sigma = 1.0, max = 4096 }\n'
        'output = { dist = "lognormal", median = 150, sigma = 0.8, max = 1024 }\n')
    subprocess.run(LLMLB + ["gen", str(folder / "w.toml"), "-o", str(folder / "t.parquet")], check=True,
                   capture_output=True)
    return folder / "t.parquet"


@pytest.mark.parametrize("after_s", INSTANTS)
def test_simulate_killed_keeps_its_flushed_rows(tmp_path, after_s):
    big_trace(tmp_path, requests=600_000)
    proc = subprocess.Popen(LLMLB + ["simulate", str(tmp_path / "t.parquet"), "-r", str(tmp_path / "res"),
                                     "--run-id", "s", "-f", "json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    between = _wait_for_part(proc, tmp_path / "res" / "s" / "requests.parquet")
    _kill(proc, after_s * between)  # 2 of at least 9 parts: the kill lands with 7 parts of work left
    rows = _check_survivors(tmp_path / "res" / "s", set(range(600_000)))
    assert {r["status"] for r in rows} <= {"ok", "rejected", "error", "timeout"}


@pytest.fixture
def noop():
    with noop_server(itl_ms=20.0) as url:
        yield url


def _wait_for_history(proc: subprocess.Popen, folder: Path) -> float:
    """Wait until the replay has a history its durability can be judged on; return ``flush``, the
    longest interval between two part files seen.

    Finished rows reach the disk within two flush intervals (handed to the writer at the next
    once-a-second tick, written by the flush after it, docs/security.md): two seconds where the
    writer keeps pace, longer where the machine is loaded, and the interval between part files is
    that machine's own flush interval. The wait goes on until the first part is older than two
    such intervals (and at least three parts are out), so the rows the check is about exist on
    any machine: those of the first part, which finished before it appeared."""
    seen: list[float] = []
    while True:
        n = len(table_files(folder))
        assert proc.poll() is None, f"the run ended before its history was long enough: {proc.communicate()}"
        while len(seen) < n:
            seen.append(time.monotonic())
        if n >= 3:
            flush = max(b - a for a, b in zip(seen, seen[1:]))
            if time.monotonic() - seen[0] > 2 * flush + 0.5:
                return flush
        time.sleep(0.02)


@pytest.mark.parametrize("after_s", INSTANTS)
def test_replay_killed_then_resumed_ends_with_one_row_per_trace_row(tmp_path, noop, after_s):
    n = 1200
    write_trace(make_trace(n=n, rate=80.0, output_tokens=5), tmp_path / "t.parquet")
    run_dir = tmp_path / "res" / "k"
    proc = subprocess.Popen(LLMLB + ["replay", str(tmp_path / "t.parquet"), "-e", noop, "-r", str(tmp_path / "res"),
                                     "--run-id", "k", "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    flush = _wait_for_history(proc, run_dir / "requests.parquet")
    _kill(proc, after_s * flush)
    killed_at = time.perf_counter()  # the server's clock (perf_counter is system-wide on Linux)
    survivors = {r["request_id"]: r for r in _check_survivors(run_dir, set(range(n)))}
    # every request the server had finished two of this run's flush intervals before the kill survived
    # (there are such requests: the wait made sure the first part's are)
    records = server_records(noop)
    done_early = {int(k) for k, (_, _, last, _) in records.items() if 0 < last < killed_at - 2 * flush}
    assert done_early and done_early <= set(survivors), (flush, sorted(done_early - set(survivors))[:10])

    out = subprocess.run(LLMLB + ["replay", str(tmp_path / "t.parquet"), "-e", noop, "--resume", str(run_dir),
                                  "--no-progress"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    assert sorted(r["request_id"] for r in rows) == list(range(n))  # exactly one row per trace row
    assert json.loads((run_dir / "run.json").read_text())["status"] == "complete"
    kept = {r["request_id"]: r for r in rows if r["request_id"] in survivors}
    assert all(kept[i]["sent_s"] == r["sent_s"] and kept[i]["status"] == r["status"]
               for i, r in survivors.items() if r["status"] == "ok")
    assert not any(p.name.endswith("resume-backup") for p in (tmp_path / "res").iterdir())


def test_rows_reach_the_disk_within_the_flush_interval(tmp_path):
    """The bound itself, on a fake clock: a buffered row is in a complete part file by the first
    ``flush_if_due`` call ``flush_s`` after the previous flush, even if no row follows it."""
    now = [0.0]
    sink = ParquetSink(tmp_path / "r", REQUESTS, flush_s=1.0, constants={"run_id": "x"}, clock=lambda: now[0])
    now[0] = 0.5
    sink.write({"request_id": [1], "status": ["ok"]})
    assert table_files(tmp_path / "r") == [] and sink.pending_rows == 1
    now[0] = 0.9
    sink.flush_if_due()
    assert table_files(tmp_path / "r") == []
    now[0] = 1.0
    sink.flush_if_due()  # what the replayer's once-a-second timer calls
    # never closed, like a killed process's sink: the part stands alone
    assert pq.read_table(tmp_path / "r").column("request_id").to_pylist() == [1] and sink.pending_rows == 0


def test_the_row_writer_thread_is_not_idle_class(tmp_path):
    """The replayer's row writer runs in the normal scheduling class at nice +10 (Linux). It ran at
    ``SCHED_IDLE``, which gets a core only when nothing else wants it: beside a busy loop on the same
    core the rows of finished requests took more than 8 s to reach the disk."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the writer's priority is set on Linux only")
    writer = RowWriter(ParquetSink(tmp_path / "r", REQUESTS, flush_s=1.0, constants={"run_id": "x"}))
    try:
        policy, nice = writer._pool.submit(
            lambda: (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))).result()
    finally:
        writer.close()
    assert policy == os.SCHED_OTHER
    assert nice == min(19, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + WRITER_NICE)
