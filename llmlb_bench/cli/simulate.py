"""``llmlb simulate``: run a trace on the built-in cluster simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console, err_console
from llmlb_bench.cli.common import (ClusterFlags, PolicyArgs, ReportFormat, ResultsDir, RunId, Seed, SloOpt, ThinkTime,
                                    Users, cluster_flags)
from llmlb_bench.progress import working


@app.command()
@cluster_flags()
def simulate(
    trace: Annotated[Path, typer.Argument(help="Trace Parquet file (from llmlb gen or llmlb trace import).")],
    policy: Annotated[str, typer.Option("--policy", "-p", help="Routing policy (see llmlb policies).")] = "least_outstanding",
    policy_arg: PolicyArgs = None,
    cluster: ClusterFlags = ClusterFlags(),
    seed: Seed = 0,
    results: ResultsDir = Path("results"),
    run_id: RunId = None,
    label: Annotated[Optional[str], typer.Option("--label", help="Short name shown in reports (default: policy).")] = None,
    users: Users = None,
    think_time: ThinkTime = 0.0,
    slo: SloOpt = None,
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f", help="Report format.")] = ReportFormat.terminal,
) -> None:
    """Simulate TRACE on a cluster (identical replicas, or pools from --cluster) and store the run under --results.

    Example:

        llmlb simulate trace.parquet --replicas 8 --gpu h100-sxm --model llama-3-70b --tp 4 --policy round_robin

        llmlb simulate trace.parquet --cluster clusters/disaggregated.toml --policy pd_pair --format json

        llmlb simulate trace.parquet --users 32 --think-time 1     # closed loop, as llmlb replay --users
    """
    from llmlb_bench.experiment import simulate_run
    from llmlb_bench.policies import parse_args
    from llmlb_bench.report.output import print_report
    from llmlb_bench.schema import read_trace
    from llmlb_bench.store import new_run_id

    table = read_trace(trace)
    config = cluster.config()
    run_id = run_id or new_run_id(label or policy)
    try:
        with working(err_console, f"simulating {table.num_rows:,} requests under {policy}"):
            store = simulate_run(table, trace, config, policy, parse_args(policy_arg), seed, results, label, run_id,
                                     users=users, think_s=think_time)
    except KeyboardInterrupt:
        if (Path(results) / run_id / "run.json").is_file():
            err_console.print(f"simulation interrupted; the partial run (requests simulated so far) is kept in "
                              f"{Path(results) / run_id}", highlight=False, soft_wrap=True)
        raise
    if fmt is ReportFormat.terminal:
        console.print(f"stored run [bold]{store.run_id}[/] in {store.dir}")
    print_report([store.dir], slo, fmt, console=console)
