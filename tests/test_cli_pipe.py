"""What the CLI prints survives a pipe: with stdout redirected to a file (every CI log) and COLUMNS unset,
no table or --help cuts a value, a name or a flag with "…" (llmlb_bench/console.py).

Every command runs as a real subprocess whose stdout is a file, the way a CI job runs it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmlb_bench.cli import main
from llmlb_bench.policies.registry import BUILTIN
from llmlb_bench.repro.registry import REPRODUCTIONS
from tests.conftest import make_trace

REPO = Path(__file__).resolve().parents[1]
CHAT = (REPO / "workloads" / "chat.toml").as_posix()
CUT = "…"


def _env() -> dict[str, str]:
    """No width from the environment: Rich has no terminal to measure and would fall back to 80 columns."""
    drop = {"COLUMNS", "LINES", "TERMINAL_WIDTH", "FORCE_COLOR", "PY_COLORS", "GITHUB_ACTIONS"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def piped(tmp_path: Path, *args: str, code: int = 0) -> str:
    """stdout of ``llmlb ARGS`` run with stdout redirected to a file."""
    out = tmp_path / "stdout.txt"
    with out.open("w") as f:
        done = subprocess.run([sys.executable, "-m", "llmlb_bench", *args], stdout=f, stderr=subprocess.PIPE,
                              text=True, env=_env(), stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == code, done.stderr
    text = out.read_text()
    assert CUT not in text, text
    return text


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """Two simulated runs of one trace with long policy names."""
    root = tmp_path_factory.mktemp("pipe")
    trace = root / "t.parquet"
    import pyarrow.parquet as pq

    pq.write_table(make_trace(60, rate=6.0), trace)
    for policy in ("round_robin", "least_outstanding"):
        main(["simulate", str(trace), "--replicas", "2", "--policy", policy, "-r", str(root / "results"),
              "--run-id", f"a-rather-long-run-name-of-{policy}"])
    return root / "results"


def test_gate_rules_values_and_intervals_are_whole(tmp_path, results):
    runs = sorted(results.iterdir())
    rules = ["goodput >= -5%", "p99_ttft <= +10%", "p50_e2e <= +10%", "attainment >= 0.5"]
    text = piped(tmp_path, "gate", str(runs[1]), str(runs[0]), "--slo", "ttft=500ms,tpot=50ms",
                 *[a for r in rules for a in ("--rule", r)], code=0)
    for rule in rules:
        assert rule in text


def test_report_names_every_run_whole(tmp_path, results):
    text = piped(tmp_path, "report", str(results), "--slo", "ttft=500ms", "--no-ci")
    for policy in ("round_robin", "least_outstanding"):  # the report names runs by their label
        assert policy in text


def test_repro_list_names_are_whole_so_they_can_be_typed(tmp_path):
    text = piped(tmp_path, "repro", "list")
    lines = text.splitlines()
    for name in REPRODUCTIONS:
        assert any(f" {name} " in line for line in lines), name


def test_policies_lists_every_name_whole(tmp_path):
    text = piped(tmp_path, "policies")
    for name in BUILTIN:
        assert name in text


def test_sweep_table_is_whole(tmp_path):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(f"""
name = "a-sweep-with-a-long-name"
slo = "ttft=400ms,tpot=50ms"
seeds = [3]
[workloads]
chat-with-a-long-workload-name = {{ spec = "{CHAT}", requests = 60 }}
[clusters]
two-replicas-of-the-default-gpu = {{ replicas = 2 }}
[policies]
least-outstanding-requests-first = {{ policy = "least_outstanding" }}
[load]
rate = [10]
""")
    text = piped(tmp_path, "sweep", str(sweep), "-r", str(tmp_path / "r"), "-j", "1")
    for name in ("least-outstanding-requests-first", "two-replicas-of-the-default-gpu", "chat-with-a-long-workload-name"):
        assert name in text


_WALK = """
import sys, typer
from llmlb_bench.cli.app import app, main
from llmlb_bench.cli.commands import load_all
load_all()
def walk(c, path):
    yield path, c
    for name, sub in getattr(c, "commands", {}).items():
        yield from walk(sub, path + [name])
for path, c in walk(typer.main.get_command(app), []):
    flags = [o for p in c.params for o in p.opts + p.secondary_opts if o.startswith("--")]
    print("=====", " ".join(path), "|", " ".join(flags), flush=True)
    try:
        main(path + ["--help"])
    except SystemExit as exc:
        assert not exc.code, (path, exc.code)
"""


def test_every_help_shows_whole_flag_names(tmp_path):
    """Every command's and subcommand's --help, walked from the Typer app, in one process whose stdout is a file."""
    text = _python_piped(tmp_path, _WALK)
    sections = text.split("===== ")[1:]
    assert len(sections) > 20
    for section in sections:
        head, body = section.split("\n", 1)
        path, flags = head.split(" | ")
        for flag in flags.split():
            assert f"{flag} " in body or f"{flag}," in body or f"{flag}\n" in body, (path, flag)


def _python_piped(tmp_path: Path, code: str) -> str:
    out = tmp_path / "stdout.txt"
    with out.open("w") as f:
        done = subprocess.run([sys.executable, "-c", code], stdout=f, stderr=subprocess.PIPE, text=True, env=_env(),
                              stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert CUT not in text, text
    return text


def test_a_table_narrower_than_its_values_folds_them_and_loses_nothing():
    """Even at a width the user chose too narrow, a cell wraps inside a word: no "…", no silent crop (Rich crops a
    no_wrap cell that does not fit)."""
    import io

    from rich.console import Console

    from llmlb_bench.console import Table

    console = Console(width=30, record=True, file=io.StringIO())
    t = Table("a", "b")
    t.add_column("c", no_wrap=True)
    t.add_row("x" * 40, "y" * 37, "z" * 33)
    console.print(t)
    text = console.export_text()
    assert CUT not in text
    assert (text.count("x"), text.count("y"), text.count("z")) == (40, 37, 33)


def _commands():
    import typer

    from llmlb_bench.cli.app import app
    from llmlb_bench.cli.commands import load_all

    load_all()  # commands load lazily: register every one to walk them

    def walk(c, path):
        yield path, c
        for name, sub in getattr(c, "commands", {}).items():
            yield from walk(sub, path + [name])

    return list(walk(typer.main.get_command(app), []))


def test_every_command_help_carries_an_example():
    """Each command, subcommand and group, walked from the Typer app: an 'Example' that runs that very command."""
    found = _commands()
    assert len(found) > 20
    for path, c in found:
        text = c.help or ""
        assert "Example" in text, path
        command = f"llmlb {' '.join(path)}".rstrip()
        assert re.search(re.escape(command) + r"(\s|$)", text.split("Example", 1)[1]), path


def test_consoles_and_tables_are_made_in_one_place():
    """llmlb_bench/console.py holds the pipe policy: no other module makes a Rich Console or a plain Rich Table."""
    package = REPO / "llmlb_bench"
    for path in package.rglob("*.py"):
        if path.name == "console.py" and path.parent == package:
            continue
        text = path.read_text()
        assert "from rich.table import" not in text and "Console(" not in text, path
