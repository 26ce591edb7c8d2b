"""The README's tour, run as CI runs it: every command that needs no real engine or server, as a subprocess
with stdout redirected to a file, on small copies of the presets it names.

The commands are read from the README itself (the ``sh`` block under "A short tour"), so a tour that
stops working, or whose output is cut ("…") or reports failed requests without saying why, fails here.
Left out, and why: commands that start or need servers and engines (serve, engine, replay, routers,
route, capacity: tests/test_serve_*, test_replay_*, test_routers_* run them), the full sweep and
``repro run --all`` (minutes; tests/test_sweep_cli.py and tests/test_repro_*.py run smaller ones).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from llmlb_bench.tomlfile import dumps_toml, read_toml

REPO = Path(__file__).resolve().parents[1]
#: llmlb subcommands the tour runs here (the rest need engines or servers, or take minutes)
RUN = {"gen", "simulate", "trace", "run", "report", "query", "policies", "gate"}
#: requests of each preset's small copy
SMALL = 300
#: the runs the gate's line compares: made the way a CI job makes its baseline and candidate
GATE_SIDES = {"main": ["--policy", "least_outstanding"], "pr": ["--policy", "round_robin"]}


def tour_commands() -> list[list[str]]:
    """The tour's commands as argument lists (``a && b`` is two; background ``... &`` lines are left out)."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"## A short tour.*?```sh\n(.*?)```", text, re.S)
    assert block, "README.md has no 'A short tour' sh block"
    lines, pending = [], ""
    for line in block.group(1).splitlines():          # a quoted argument may run over lines (the query)
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending, comments=True)
        except ValueError:
            continue
        lines.append(pending)
        pending = ""
    out = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words and words[-1] == "&":
            continue
        cmd: list[str] = []
        for w in words + ["&&"]:
            if w == "&&":
                out.append(cmd)
                cmd = []
            else:
                cmd.append(w)
    return [c for c in out if c and c[0] == "llmlb"]


def _small_copy(tmp: Path, spec: str) -> None:
    """workloads/X.toml as a copy of SMALL requests at the same path under ``tmp``."""
    doc = read_toml(REPO / spec)
    doc.pop("duration_s", None)
    doc["requests"] = SMALL
    (tmp / spec).parent.mkdir(parents=True, exist_ok=True)
    (tmp / spec).write_text(dumps_toml(doc))


def _azure_csv(tmp: Path, name: str) -> None:
    """An Azure 2023-format CSV (TIMESTAMP with 7 fraction digits, ContextTokens, GeneratedTokens)."""
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.exponential(0.2, SMALL))
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for s, i, o in zip(t, rng.lognormal(6.5, 1.0, SMALL).astype(int) + 1, rng.lognormal(5, 0.8, SMALL).astype(int) + 1):
        whole = int(s)
        rows.append(f"2023-11-16 18:{whole // 60:02d}:{whole % 60:02d}.{int((s - whole) * 1e7):07d},{min(i, 6000)},"
                    f"{min(o, 2000)}")
    (tmp / name).write_text("\n".join(rows) + "\n")


def _llmlb(args: list[str], tmp: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}   # as in a CI log
    env["PYTHONPATH"] = str(REPO)
    with out.open("w") as stdout:
        return subprocess.run([sys.executable, "-m", "llmlb_bench", *args], cwd=tmp, env=env, stdout=stdout,
                              stderr=subprocess.PIPE, text=True, timeout=900)


@pytest.mark.slow
def test_the_readme_tour_runs_with_stdout_redirected(tmp_path):
    commands = [c for c in tour_commands() if c[1] in RUN]
    assert len(commands) >= 12, commands
    for c in commands:                                       # the files the commands read, small
        for w in c:
            if re.fullmatch(r"workloads/[\w-]+\.toml", w):
                _small_copy(tmp_path, w)
            elif re.fullmatch(r"clusters/[\w-]+\.toml", w):
                (tmp_path / "clusters").mkdir(exist_ok=True)
                shutil.copy(REPO / w, tmp_path / w)
        if c[1:3] == ["trace", "import"]:
            _azure_csv(tmp_path, c[4])
    outputs = []
    for i, c in enumerate(commands):
        if c[1] == "gate":
            for side, flags in GATE_SIDES.items():
                p = _llmlb(["simulate", "trace.parquet", "-r", f"results/{side}", *flags], tmp_path,
                           tmp_path / f"setup-{side}.txt")
                assert p.returncode == 0, p.stderr
        out = tmp_path / f"out-{i:02d}-{c[1]}.txt"
        p = _llmlb(c[1:], tmp_path, out)
        # the gate's sides may differ within noise or beyond it: 0 or 1; anything else is a failure
        assert p.returncode in ((0, 1) if c[1] == "gate" else (0,)), f"{shlex.join(c)}: {p.stderr}"
        assert "Traceback" not in p.stderr, p.stderr
        text = out.read_text()
        assert "…" not in text, f"{shlex.join(c)} cut its output:\n{text}"
        assert text.strip(), shlex.join(c)
        outputs.append((c, text))
    assert sum(c[1] in ("report", "run", "simulate") for c, _ in outputs) >= 6
    # run -p round_robin -p least_outstanding: round_robin, the first policy given, is the baseline
    [run_out] = [t for c, t in outputs if c[1] == "run" and "least_outstanding" in c]
    assert "verdict: least_outstanding vs round_robin:" in run_out
    # every request that is not ok is counted with a stated reason, in the JSON and on the terminal
    [(_, js)] = [(c, t) for c, t in outputs if c[1] == "report" and "json" in c]
    doc = json.loads(js)
    assert len(doc["runs"]) >= 5
    for run in doc["runs"]:
        failed = run["error"] + run["timeout"] + run["rejected"] + run["not_sent"]
        assert sum(f["requests"] for f in run["failures"]) == failed, run["run_id"]
        assert all(f["reason"] and f["reason"] != "no reason recorded" for f in run["failures"]), run["failures"]
    reasons = {f["reason"] for run in doc["runs"] for f in run["failures"]}
    for c, text in outputs:
        if c[1] == "report" and "json" not in c:        # the terminal reports of every run say the same
            flat = " ".join(text.split())
            assert all(" ".join(r.split()) in flat for r in reasons), (shlex.join(c), reasons)
            assert ("Failures: why requests are not ok" in text) == bool(reasons)
    # the presets fit the default model: the chat runs of the tour fail nothing
    chat = [r for r in doc["runs"] if (r["facets"].get("workload") or "").startswith("chat#")]
    assert chat and all(r["ok"] == r["requests"] for r in chat), [(r["name"], r["failures"]) for r in chat]
    assert pq.read_metadata(tmp_path / "trace.parquet").num_rows == SMALL
