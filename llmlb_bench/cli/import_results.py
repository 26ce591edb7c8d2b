"""``llmlb import-results``: other tools' result files as runs in the store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import ResultsDir
from llmlb_bench.peer_results import PARSERS, import_results


@app.command("import-results")
def import_results_cmd(
    files: Annotated[list[Path], typer.Argument(help="Result files of vLLM, GuideLLM or AIPerf.")],
    results: ResultsDir = Path("results"),
    tool: Annotated[str, typer.Option(
        "--tool", help=f"auto (from the file's structure) or one of: {', '.join(PARSERS)}.")] = "auto",
    label: Annotated[Optional[str], typer.Option("--label", help="Label of the imported runs in reports.")] = None,
) -> None:
    """Import results of other benchmarking tools as runs (backend = the tool), to report them beside ours.

    Reads vLLM `vllm bench serve --save-result --save-detailed` JSON, GuideLLM
    benchmarks.json (one run per benchmark) and AIPerf profile_export.jsonl.

    Example:

        llmlb import-results vllm-10qps.json artifacts/run1/profile_export.jsonl --results results/

        llmlb report results/ --slo ttft=500ms,tpot=50ms
    """
    for f in files:
        for d in import_results(f, results, tool, label):
            console.print(f"imported {f} -> {d}")
