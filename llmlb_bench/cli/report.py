"""``llmlb report``: compare runs (terminal, Markdown, JSON, self-contained HTML, figure files)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import ReportFormat, SloOpt
from llmlb_bench.metrics.definitions import Definitions
from llmlb_bench.metrics.sample import DEFAULT_SAMPLE


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
        "--attainment-target", min=0.0, max=1.0, help="Attainment a load must reach to count for capacity (DistServe's max goodput).")] = 0.9,
    price: Annotated[Optional[float], typer.Option(
        "--price-per-hour", min=0.0, help="Fleet price in $/hour (default: GPU catalog, simulated runs).")] = None,
    window: Annotated[float, typer.Option("--window", min=1e-3, help="Fairness window in seconds.")] = 10.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap intervals.")] = 0,
    baseline: Annotated[Optional[str], typer.Option(
        "--baseline", help="Run (id, name, policy or folder) the verdicts compare the others with (default: the run created first).")] = None,
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

        llmlb report results/ --slo ttft=500ms --baseline round_robin
    """
    from llmlb_bench.metrics.summary import Options
    from llmlb_bench.report.output import print_report

    options = Options(definitions=definitions, seed=seed, ci=not no_ci, window_s=window, price_per_hour=price,
                      token_sample=token_sample)
    print_report(runs or [Path("results")], slo, fmt, options=options, target=target, output=output,
                 figures_dir=figures_dir, console=console, baseline=baseline)
