"""Options shared by several commands (declared once, used by each)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

if TYPE_CHECKING:
    from llmlb_bench.sim import ClusterConfig

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

# cluster shape (the simulator's ClusterConfig fields). Every flag defaults to None: unset
# flags leave the --cluster file's value, or ClusterConfig's default, in force.
ClusterFile = Annotated[Optional[Path], typer.Option(
    "--cluster", help="Cluster TOML: ClusterConfig fields, [[pools]] for mixed or disaggregated fleets, "
                      "[autoscale], [moe] (see clusters/). Flags below override its top-level fields.")]
Replicas = Annotated[Optional[int], typer.Option("--replicas", min=1, help="Number of replicas [default: 4].")]
Gpu = Annotated[Optional[str], typer.Option(
    "--gpu", help="GPU type from the catalog (see docs/simulator.md) [default: a100-80g].")]
Model = Annotated[Optional[str], typer.Option("--model", help="Model from the catalog [default: llama-3-8b].")]
Tp = Annotated[Optional[int], typer.Option("--tp", min=1, help="Tensor-parallel degree per replica [default: 1].")]
Pp = Annotated[Optional[int], typer.Option("--pp", min=1, help="Pipeline-parallel stages per replica (each on tp "
                                                               "GPUs) [default: 1].")]
MaxSeqs = Annotated[Optional[int], typer.Option(
    "--max-num-seqs", min=1, help="Max running requests per replica [default: vLLM's default for the GPU].")]
MaxTokens = Annotated[Optional[int], typer.Option(
    "--max-batched-tokens", min=1, help="Token budget per engine step [default: vLLM's default for the GPU].")]
SchedulerOpt = Annotated[Optional[str], typer.Option(
    "--scheduler", help="Engine-level scheduler of each replica: fcfs, priority, sjf, vtc, deadline "
                        "or package.module:Class (see llmlb policies) [default: fcfs].")]
SchedulerArgs = Annotated[
    Optional[list[str]],
    typer.Option("--scheduler-arg", help="Engine scheduler parameter key=value (repeatable)."),
]
SignalRefresh = Annotated[Optional[float], typer.Option(
    "--signal-refresh", min=0.0, help="Seconds between scrapes of the replicas' queue and KV signals that "
                                      "routers read (0 = always fresh; the router's own counts are exact) "
                                      "[default: 0].")]


def cluster_config(cluster_file: Path | None, *, replicas: int | None, gpu: str | None, model: str | None,
                   tp: int | None, pp: int | None, max_num_seqs: int | None, max_batched_tokens: int | None,
                   scheduler: str | None, scheduler_arg: list[str] | None,
                   signal_refresh: float | None) -> "ClusterConfig":
    """The cluster the flags describe: the --cluster file (or defaults) with given flags on top."""
    from llmlb_bench.policies import parse_args
    from llmlb_bench.sim import ClusterConfig, load_cluster

    flags = {"replicas": replicas, "gpu": gpu, "model": model, "tp": tp, "pp": pp, "max_num_seqs": max_num_seqs,
             "max_num_batched_tokens": max_batched_tokens, "scheduler": scheduler,
             "scheduler_args": parse_args(scheduler_arg, "--scheduler-arg") or None,
             "signal_refresh_s": signal_refresh}
    given = {k: v for k, v in flags.items() if v is not None}
    if cluster_file is not None:
        return load_cluster(cluster_file, given)
    return ClusterConfig.from_dict(given)


class ReportFormat(str, Enum):
    terminal = "terminal"
    json = "json"
    md = "md"
    html = "html"


class TableFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"
