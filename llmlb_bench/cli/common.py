"""Options shared by several commands (declared once, used by each)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

ResultsDir = Annotated[Path, typer.Option("--results", "-r", help="Results directory (one folder per run).")]
SloOpt = Annotated[
    Optional[str],
    typer.Option("--slo", help="Per-request SLO, e.g. ttft=500ms,tpot=50ms,e2e=20s (units us/ms/s; ms if omitted)."),
]
PolicyArgs = Annotated[
    Optional[list[str]],
    typer.Option("--policy-arg", help="Policy parameter key=value (repeatable)."),
]
Seed = Annotated[int, typer.Option("--seed", help="Seed for every random choice of the run.")]

# cluster shape (the simulator's ClusterConfig fields)
Replicas = Annotated[int, typer.Option("--replicas", min=1, help="Number of replicas.")]
Gpu = Annotated[str, typer.Option("--gpu", help="GPU type from the catalog (see docs/simulator.md).")]
Model = Annotated[str, typer.Option("--model", help="Model from the catalog.")]
Tp = Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel degree per replica.")]
MaxSeqs = Annotated[Optional[int], typer.Option(
    "--max-num-seqs", min=1, help="Max running requests per replica (default: vLLM's default for the GPU).")]
MaxTokens = Annotated[Optional[int], typer.Option(
    "--max-batched-tokens", min=1, help="Token budget per engine step (default: vLLM's default for the GPU).")]
SchedulerOpt = Annotated[str, typer.Option(
    "--scheduler", help="Engine-level scheduler of each replica: fcfs, priority, sjf, vtc, deadline "
                        "or package.module:Class (see llmlb policies).")]
SchedulerArgs = Annotated[
    Optional[list[str]],
    typer.Option("--scheduler-arg", help="Engine scheduler parameter key=value (repeatable)."),
]
SignalRefresh = Annotated[float, typer.Option(
    "--signal-refresh", min=0.0, help="Seconds between scrapes of the replicas' queue and KV signals that "
                                      "routers read (0 = always fresh; the router's own counts are exact).")]


class ReportFormat(str, Enum):
    terminal = "terminal"
    json = "json"
    md = "md"
    html = "html"


class TableFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"
