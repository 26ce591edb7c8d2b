"""``llmlb report``: compare runs (terminal, Markdown, JSON, self-contained HTML, figure files)."""

from __future__ import annotations

import io
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import ReportFormat, SloOpt
from llmlb_bench.errors import UserError
from llmlb_bench.metrics.definitions import Definitions
from llmlb_bench.metrics.sample import DEFAULT_SAMPLE
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options
from llmlb_bench.report import figures, html, markdown, terminal
from llmlb_bench.report.document import ReportOptions, build, to_json
from llmlb_bench.report.figdata import figure_data
from llmlb_bench.store.run import write_text_atomic
from llmlb_bench.store.views import Catalog


def _write(text: str, output: Path | None) -> None:
    """To stdout, or atomically to ``output`` (a failed report leaves no half-written file)."""
    if output is None:
        sys.stdout.write(text)
        return
    if output.is_dir():
        raise UserError("is a directory, expected a file name", output)
    write_text_atomic(output, text)


def print_report(paths: list[Path], slo_text: str | None, fmt: ReportFormat, *,
                 options: Options | None = None, target: float = 0.9, output: Path | None = None,
                 figures_dir: Path | None = None) -> None:
    """Build the report of the runs under ``paths`` and render it (also used by run/simulate/replay)."""
    slo = Slo.parse(slo_text)
    drawn = fmt is ReportFormat.html or figures_dir is not None
    if drawn:
        figures.require()
    cat = Catalog(paths)
    summary = replace(options or Options(), cdf=drawn)
    doc = build(cat, ReportOptions(slo=slo, summary=summary, target=target), ", ".join(map(str, paths)))
    figs = figures.render(doc, figure_data(cat, doc), figures_dir) if drawn else []
    if fmt is ReportFormat.json:
        _write(to_json(doc), output)
    elif fmt is ReportFormat.md:
        _write(markdown.render(doc), output)
    elif fmt is ReportFormat.html:
        _write(html.render(doc, figs), output)
    elif output is None:
        terminal.render(doc, console)
    else:
        out = Console(record=True, width=160, file=io.StringIO())
        terminal.render(doc, out)
        _write(out.export_text(), output)
    if figures_dir is not None:
        Console(stderr=True).print(f"figures: {len(figs)} x {', '.join(figures.FORMATS)} -> {figures_dir}")


@app.command()
def report(
    runs: Annotated[Optional[list[Path]], typer.Argument(help="Run folders or results directories.")] = None,
    slo: SloOpt = None,
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f", help="Output format.")] = ReportFormat.terminal,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the report to this file.")] = None,
    figures_dir: Annotated[Optional[Path], typer.Option(
        "--figures", help="Also write every figure as PNG, SVG and PDF into this directory.")] = None,
    definitions: Annotated[Definitions, typer.Option(
        "--definitions", help="TPOT/ITL definitions: vllm (bench serve) or guidellm.")] = Definitions.vllm,
    target: Annotated[float, typer.Option(
        "--attainment-target", min=0.0, max=1.0, help="Attainment a load must reach to count for max goodput.")] = 0.9,
    price: Annotated[Optional[float], typer.Option(
        "--price-per-hour", min=0.0, help="Fleet price in $/hour (default: GPU catalog, simulated runs).")] = None,
    window: Annotated[float, typer.Option("--window", min=1e-3, help="Fairness window in seconds.")] = 10.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap intervals.")] = 0,
    no_ci: Annotated[bool, typer.Option("--no-ci", help="Skip bootstrap confidence intervals.")] = False,
    token_sample: Annotated[int, typer.Option(
        "--token-sample", min=1,
        help="Ok requests per run that ITL and token pacing read in full; larger runs are block-sampled.")] = DEFAULT_SAMPLE,
) -> None:
    """Summarise and compare runs: latency percentiles with bootstrap intervals, SLO attainment and goodput,
    token pacing, fairness, energy and cost, load curves.

    Example:

        llmlb report results/ --slo ttft=500ms,tpot=50ms

        llmlb report results/ --slo ttft=1s --format html -o report.html --figures figs/

        llmlb report results/rr-20261129-120000-ab12 --format md --definitions guidellm
    """
    options = Options(definitions=definitions, seed=seed, ci=not no_ci, window_s=window, price_per_hour=price,
                      token_sample=token_sample)
    print_report(runs or [Path("results")], slo, fmt, options=options, target=target, output=output,
                 figures_dir=figures_dir)
