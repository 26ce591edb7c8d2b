"""Ctrl-C during ``llmlb run``: one line says the partial run was kept, and where (a real subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmlb_bench.store.parts import table_files
from tests.conftest import CTRL_C

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ctrl_c_during_run_keeps_the_partial_run_and_says_where(tmp_path):
    spec = tmp_path / "big.toml"
    spec.write_text((REPO / "workloads" / "chat.toml").read_text().replace("requests = 3000", "requests = 400000"))
    proc = subprocess.Popen([sys.executable, "-m", "llmlb_bench", "run", str(spec), "-r", str(tmp_path / "r")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "COLUMNS": "200"}, **CTRL_C)
    assert proc.stdout is not None
    line = proc.stdout.readline()                        # "trace: 400,000 requests -> ..."
    assert line.startswith("trace:"), line
    # interrupt once the first policy's run has rows on disk, counted in the run's progress rather
    # than seconds (a slower machine only gets there later), and wait for the end in proportion
    start = time.monotonic()
    while not [p for p in (tmp_path / "r").glob("*/*/requests.parquet") if table_files(p)]:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=max(120.0, 10 * (time.monotonic() - start)))
    assert proc.returncode == 130, err
    [kept] = [ln for ln in err.splitlines() if "partial run" in ln]
    folder = Path(kept.split(" is kept in ")[1].split(",")[0])
    meta = json.loads((tmp_path / folder / "run.json").read_text() if not folder.is_absolute()
                      else (folder / "run.json").read_text())
    assert meta["status"] == "partial"
