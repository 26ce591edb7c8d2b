"""``llmlb sweep``: run (or resume) a sweep file and print its capacities and stability curves."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from llmlb_bench.cli.app import app, console, err_console
from llmlb_bench.cli.common import ReportFormat, ResultsDir

#: sweep.executors.EXECUTORS, written out for the help: importing the sweep package (the simulator,
#: DuckDB) would slow `llmlb sweep --help`; tests/test_cli_startup.py checks the two agree
EXECUTORS = ("local", "ray")


class _Bar:
    """The sweep's progress, one bar per phase, on stderr (stdout stays clean for --format json)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None

    def phase(self, name: str, total: int, done: int) -> None:
        label = "capacity searches" if name == "capacity" else "grid cells"
        suffix = f" ({done} done earlier)" if done else ""
        self.task = self.progress.add_task(f"{label}{suffix}", total=total, completed=done)

    def advance(self, ran: bool) -> None:
        assert self.task is not None
        self.progress.advance(self.task)


@app.command()
def sweep(
    file: Annotated[Path, typer.Argument(help="Sweep file (TOML), e.g. sweeps/policies.toml.")],
    results: ResultsDir = Path("results"),
    executor: Annotated[str, typer.Option("--executor", "-e", help=f"Where cells run: {', '.join(EXECUTORS)}.")] = "local",
    address: Annotated[Optional[str], typer.Option(
        "--address", help="Ray cluster to join (auto, host:port, ray://host:10001); default: a local instance.")] = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", "-j", help="Parallel workers (default: every CPU).")] = None,
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f", help="Output format.")] = ReportFormat.terminal,
    figures: Annotated[Optional[Path], typer.Option(
        "--figures", help="Also write the robustness curves (goodput and TTFT p99 against each knob) "
                          "as SVG files into this folder.")] = None,
) -> None:
    """Run a SWEEP over rate x policy x cluster x workload x seed on the simulator; print capacities,
    stability curves and knees. Reruns skip finished cells, so an interrupted sweep resumes.

    Runs go to RESULTS/<sweep name>/, one folder per cell tagged with its coordinates (run.json config.sweep); summary.json holds the capacities and curves.

    Example:

        llmlb sweep sweeps/policies.toml

        llmlb sweep sweeps/policies.toml --executor ray --address auto

        llmlb sweep sweeps/policies.toml --format html > sweep.html   # tables and curves, no matplotlib needed

        llmlb query -r results/policies "select meta->>'$.config.sweep.policy' as policy, count(*) from runs group by 1"
    """
    from llmlb_bench.sweep import load_sweep, make_executor, run_sweep
    from llmlb_bench.sweep.render import render, render_html, render_markdown

    spec = load_sweep(file)
    with make_executor(executor, workers, address) as ex:
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TimeRemainingColumn(), console=err_console, transient=fmt is not ReportFormat.terminal)
        with bar:
            outcome = run_sweep(spec, results, ex, _Bar(bar))
    summary = outcome.summary(spec)
    if figures is not None:
        from llmlb_bench.sweep.render import robustness_charts

        figures.mkdir(parents=True, exist_ok=True)
        for stem, chart in robustness_charts(summary):
            tmp = figures / f".{stem}.svg.tmp"
            tmp.write_text(chart)
            tmp.replace(figures / f"{stem}.svg")
    if fmt is ReportFormat.json:
        sys.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
        return
    if fmt is ReportFormat.md:
        sys.stdout.write(render_markdown(summary))
        return
    if fmt is ReportFormat.html:
        sys.stdout.write(render_html(summary))
        return
    console.print(f"sweep [bold]{spec.name}[/]: simulated {outcome.ran} runs, reused {outcome.skipped} "
                  f"finished earlier -> {outcome.root}")
    render(summary, console)
