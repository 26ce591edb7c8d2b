"""``llmlb simulate``: run a trace on the built-in cluster simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import (Gpu, MaxSeqs, MaxTokens, Model, PolicyArgs, Replicas, ReportFormat,
                                    ResultsDir, SchedulerArgs, SchedulerOpt, Seed, SignalRefresh, SloOpt, Tp)
from llmlb_bench.cli.report import print_report
from llmlb_bench.experiment import simulate_run
from llmlb_bench.policies import parse_args
from llmlb_bench.schema import read_trace
from llmlb_bench.sim import ClusterConfig


@app.command()
def simulate(
    trace: Annotated[Path, typer.Argument(help="Trace Parquet file (from llmlb gen or llmlb trace import).")],
    policy: Annotated[str, typer.Option("--policy", "-p", help="Routing policy (see llmlb policies).")] = "least_outstanding",
    policy_arg: PolicyArgs = None,
    replicas: Replicas = 4,
    gpu: Gpu = "a100-80g",
    model: Model = "llama-3-8b",
    tp: Tp = 1,
    max_num_seqs: MaxSeqs = None,
    max_batched_tokens: MaxTokens = None,
    scheduler: SchedulerOpt = "fcfs",
    scheduler_arg: SchedulerArgs = None,
    signal_refresh: SignalRefresh = 0.0,
    seed: Seed = 0,
    results: ResultsDir = Path("results"),
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Run id (default: <label>-<time>-<hex>).")] = None,
    label: Annotated[Optional[str], typer.Option("--label", help="Short name shown in reports (default: policy).")] = None,
    slo: SloOpt = None,
) -> None:
    """Simulate TRACE on a cluster of identical replicas and store the run under --results.

    Example:

        llmlb simulate trace.parquet --replicas 8 --gpu h100-sxm --model llama-3-70b --tp 4 --policy round_robin
    """
    table = read_trace(trace)
    cluster = ClusterConfig(replicas=replicas, gpu=gpu, model=model, tp=tp, max_num_seqs=max_num_seqs,
                            max_num_batched_tokens=max_batched_tokens, scheduler=scheduler,
                            scheduler_args=parse_args(scheduler_arg, "--scheduler-arg"),
                            signal_refresh_s=signal_refresh)
    store = simulate_run(table, trace, cluster, policy, parse_args(policy_arg), seed, results, label, run_id)
    console.print(f"stored run [bold]{store.run_id}[/] in {store.dir}")
    print_report([store.dir], slo, ReportFormat.terminal)
