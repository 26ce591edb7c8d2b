"""``llmlb repro``: list the scripted paper reproductions, run one or all and write reports/<name>/."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.lazy import Group
from llmlb_bench.cli.app import app, console, err_console
from llmlb_bench.console import Table
from llmlb_bench.errors import UserError
from llmlb_bench.progress import working

#: repro.base.SCALES, written out for the help: importing the reproductions (the simulator, pyarrow)
#: would slow every `llmlb repro ... --help`; tests/test_cli_startup.py checks the two agree
SCALES = ("small", "full")

repro_app = typer.Typer(help="Scripted paper reproductions: each runs simulations, checks the paper's claim "
                             "and writes reports/<name>/README.md with its figure (docs/repro.md).\n\n"
                             "Example:  llmlb repro list && llmlb repro run distserve --scale small",
                        no_args_is_help=True, cls=Group)
app.add_typer(repro_app, name="repro")


@repro_app.command("list")
def list_() -> None:
    """List the reproductions: name, source and claim.

    Example:

        llmlb repro list
    """
    from llmlb_bench.repro import REPRODUCTIONS

    t = Table("name", "source", "claim")
    for r in REPRODUCTIONS.values():
        t.add_row(r.name, r.source, r.claim)
    console.print(t)


@repro_app.command("run")
def run(
    name: Annotated[Optional[str], typer.Argument(help="Reproduction to run (see `llmlb repro list`).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Run every reproduction.")] = False,
    scale: Annotated[str, typer.Option("--scale", help=f"Size of the runs: {' or '.join(SCALES)}.")] = "full",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the simulator and randomised policies.")] = 0,
    reports: Annotated[Path, typer.Option("--reports", help="Folder of the reports (one subfolder each).")] = Path("reports"),
    profile: Annotated[Optional[Path], typer.Option("--profile", help="Run every arm on a measured engine profile (JSON from llmlb calibrate) instead of the roofline; give --reports a folder of its own.")] = None,
) -> None:
    """Run reproductions and write their reports; exit 1 when a claim's check fails.

    Example:

        llmlb repro run distserve --scale small --reports /tmp/reports

        llmlb repro run --all
    """
    from llmlb_bench.repro import REPRODUCTIONS, get, run as run_repro
    from llmlb_bench.sim.profile import read_profile

    if all_ == (name is not None):
        raise UserError("give one reproduction NAME or --all", "llmlb repro run")
    chosen = list(REPRODUCTIONS.values()) if all_ else [get(name)]  # type: ignore[arg-type]
    measured = read_profile(profile) if profile is not None else None
    failed = 0
    for i, r in enumerate(chosen, 1):
        with working(err_console, f"[{i}/{len(chosen)}] {r.name}: simulating and checking the claim"):
            out = run_repro(r, scale, reports, seed, measured)
        word = "[green]PASS[/]" if out.verdict.passed else "[red]FAIL[/]"
        console.print(f"{word} {r.name}: {out.verdict.evidence}\n  -> {out.files[0]}")
        failed += not out.verdict.passed
    if failed:
        raise typer.Exit(1)
