"""The cluster flags' help shows ClusterConfig's own defaults (read from the dataclass, so they cannot drift)."""

from __future__ import annotations

import re

from llmlb_bench.sim import ClusterConfig
from tests.conftest import cli


def test_simulate_help_shows_the_dataclass_defaults(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")          # one line per option, whatever the terminal
    code, out, _ = cli(["simulate", "--help"], capsys)
    assert code == 0
    d = ClusterConfig.build()
    for flag, value in (("--replicas", d.replicas), ("--gpu", d.gpu), ("--model", d.model), ("--tp", d.tp),
                        ("--pp", d.pp), ("--scheduler", d.scheduler), ("--signal-refresh", f"{d.signal_refresh_s:g}")):
        line = next(ln for ln in out.splitlines() if re.match(rf"\W*{flag}\s", ln))
        assert f"[default: {value}]" in line, (flag, line)
