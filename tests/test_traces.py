"""The sample traces in traces/ are what traces/README.md says made them."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import cli

TRACES = Path(__file__).resolve().parents[1] / "traces"
COMMANDS = re.findall(r"`llmlb (gen [^`]+)`", (TRACES / "README.md").read_text())


def test_every_sample_trace_has_its_command():
    made = {Path(c.split(" -o ")[1].split()[0]).name for c in COMMANDS}
    assert made == {p.name for p in TRACES.glob("*.parquet")} and len(made) >= 5


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: Path(c.split(" -o ")[1].split()[0]).stem)
def test_sample_trace_regenerates_identically(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(TRACES.parent)
    args = command.split()
    out = args.index("-o") + 1
    committed, args[out] = args[out], str(tmp_path / "t.parquet")
    code, _, err = cli(args, capsys)
    assert code == 0, err
    fresh, kept = pq.read_table(args[out]), pq.read_table(committed)
    assert fresh.num_rows == kept.num_rows and fresh.equals(kept)
    assert fresh.schema.metadata[b"llmlb.spec"] == kept.schema.metadata[b"llmlb.spec"]
