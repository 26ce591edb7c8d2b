"""``llmlb report``: compare runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import ReportFormat, SloOpt
from llmlb_bench.errors import UserError
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.report.terminal import render
from llmlb_bench.store.views import Catalog


def print_report(paths: list[Path], slo_text: str | None, fmt: ReportFormat) -> None:
    slo = Slo.parse(slo_text)
    summaries = summarize(Catalog(paths), slo)
    if not summaries:
        raise UserError("no runs with request rows found", ", ".join(map(str, paths)))
    if fmt is ReportFormat.json:
        sys.stdout.write(json.dumps({"slo": slo.to_dict() if slo else None, "runs": summaries}, indent=2) + "\n")
    else:
        render(summaries, console, slo.describe() if slo else None)


@app.command()
def report(
    runs: Annotated[Optional[list[Path]], typer.Argument(help="Run folders or results directories.")] = None,
    slo: SloOpt = None,
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f", help="Output format.")] = ReportFormat.terminal,
) -> None:
    """Summarise and compare runs: counts, throughput, TTFT/TPOT/ITL/E2E percentiles, SLO attainment, goodput.

    Example:

        llmlb report results/ --slo ttft=500ms,tpot=50ms

        llmlb report results/rr-20261129-120000-ab12 --format json
    """
    print_report(runs or [Path("results")], slo, fmt)
