"""Start-up cost of the CLI: ``llmlb --help`` loads no command module, and a command loads only its own.

Measured in benchmarks/cli_startup.py (time is never asserted here); these tests pin what makes
it fast: which modules a start-up imports.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmlb_bench.cli.commands import COMMANDS

CLI = Path(__file__).resolve().parents[1] / "llmlb_bench" / "cli"
#: what no help page imports; pydantic is Typer's, for coercing the values of a command that runs
HEAVY = ("numpy", "pyarrow", "duckdb", "pandas", "scipy", "aiohttp", "pydantic")


def _imported_after(argv: list[str]) -> set[str]:
    code = ("import sys\nfrom llmlb_bench.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    return set(out.stdout.strip().splitlines()[-1].split())


def test_top_level_help_loads_no_command_and_nothing_heavy():
    mods = _imported_after(["--help"])
    assert not {m for m in mods if m.startswith("llmlb_bench.cli.")} - {
        "llmlb_bench.cli.app", "llmlb_bench.cli.commands", "llmlb_bench.cli.lazy", "llmlb_bench.cli.typer_help"}
    assert not {m.split(".")[0] for m in mods} & set(HEAVY)


#: lighter modules a help page keeps out too: they serve a command's run or its errors only
#: (the TOML parser for a did-you-mean, Rich's live display and progress bars while a run works)
HELP_KEEPS_OUT = ("tomllib", "rich.live", "rich.progress", "llmlb_bench.tomlfile", "llmlb_bench.run_summary")


@pytest.mark.parametrize("argv", [["--help"], ["simulate", "--help"], ["replay", "--help"], ["run", "--help"],
                                  ["trace", "stats", "--help"]])
def test_a_help_page_loads_no_run_or_error_machinery(argv):
    assert not _imported_after(argv) & set(HELP_KEEPS_OUT)


def test_a_command_loads_only_its_own_module():
    mods = _imported_after(["gen", "--help"])
    loaded = {m.rpartition(".")[2] for m in mods if m.startswith("llmlb_bench.cli.")}
    assert "gen" in loaded and not loaded & ({e.module for e in COMMANDS.values()} - {"gen"})


def test_the_table_lists_every_command_module():
    registering = {p.stem for p in CLI.glob("*.py")
                   if re.search(r"^@\w*app\.command|^app\.add_typer", p.read_text(encoding="utf-8"), re.M)}
    assert registering == {e.module for e in COMMANDS.values()}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_summary_is_the_commands_own_first_help_paragraph(name):
    import typer

    from llmlb_bench.cli.app import app
    from llmlb_bench.cli.commands import load_all

    load_all()
    cmd = typer.main.get_command(app).commands[name]        # type: ignore[attr-defined]
    first = " ".join((cmd.help or "").split("\n\n")[0].split())
    assert COMMANDS[name].summary == first


def test_a_mistyped_command_gets_the_closest_one(capsys):
    from tests.conftest import cli

    code, _, err = cli(["simulat"], capsys)
    assert code == 2 and "Did you mean 'simulate'?" in err


def _subcommands(name: str) -> list[str]:
    import typer

    from llmlb_bench.cli.app import app
    from llmlb_bench.cli.commands import load

    load(name)
    cmd = typer.main.get_command(app).get_command(None, name)   # type: ignore[attr-defined]
    return sorted(getattr(cmd, "commands", {}))


#: heavy modules a command's --help may import, each with the reason it cannot avoid it
HEAVY_ALLOWED: dict[str, set[str]] = {}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_commands_help_imports_nothing_heavy(name):
    """Each command (and subcommand) builds its --help from typer and light option modules alone: the
    simulator, the replayer, the store and the report load when the command runs."""
    for argv in [[name, "--help"], *([name, sub, "--help"] for sub in _subcommands(name))]:
        heavy = {m.split(".")[0] for m in _imported_after(argv)} & set(HEAVY)
        assert not heavy - HEAVY_ALLOWED.get(name, set()), argv


def test_every_group_defaults_its_help_flag_to_false():
    """A group whose --help came in as None would make Typer load pydantic for every command's help
    (cli/lazy.py, Group)."""
    import typer

    from llmlb_bench.cli.app import app
    from llmlb_bench.cli.commands import load_all
    from llmlb_bench.cli.lazy import Group

    load_all()
    top = typer.main.get_command(app)
    groups = [top, *(c for c in top.commands.values() if hasattr(c, "commands"))]  # type: ignore[attr-defined]
    assert len(groups) > 1 and all(isinstance(g, Group) for g in groups)
    assert all(g.get_help_option(typer.Context(g)).default is False for g in groups)


def test_the_cluster_flags_show_the_simulators_defaults():
    import dataclasses

    from llmlb_bench.cli.common import _DEFAULT
    from llmlb_bench.sim.config import ClusterConfig

    defaults = {f.name: f.default for f in dataclasses.fields(ClusterConfig)}
    assert _DEFAULT == {k: defaults[k] for k in _DEFAULT}


def test_the_repro_help_names_every_scale():
    from llmlb_bench.cli import repro
    from llmlb_bench.repro.base import SCALES

    assert repro.SCALES == SCALES


def test_the_sweep_help_names_every_executor():
    from llmlb_bench.cli import sweep
    from llmlb_bench.sweep.executors import EXECUTORS

    assert sweep.EXECUTORS == EXECUTORS
