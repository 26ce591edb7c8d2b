"""``llmlb run``: the main job in one command — generate, simulate under several policies, compare."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console, err_console
from llmlb_bench.cli.common import (ClusterFlags, PolicyArgs, ReportFormat, ResultsDir, SloOpt, ThinkTime, Users,
                                    cluster_flags)
from llmlb_bench.progress import working

DEFAULT_POLICIES = ["round_robin", "least_outstanding"]


@app.command()
@cluster_flags()
def run(
    spec: Annotated[Path, typer.Argument(help="Workload spec (TOML), e.g. workloads/chat.toml.")],
    policy: Annotated[
        Optional[list[str]], typer.Option("--policy", "-p", help="Policy to compare (repeatable).")
    ] = None,
    policy_arg: PolicyArgs = None,
    cluster: ClusterFlags = ClusterFlags(),
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed (default: the spec's own).")] = None,
    results: ResultsDir = Path("results"),
    users: Users = None,
    think_time: ThinkTime = 0.0,
    slo: SloOpt = "ttft=500ms,tpot=50ms",
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f", help="Report format.")] = ReportFormat.terminal,
) -> None:
    """Generate a trace from SPEC, simulate it under each policy, store the runs and print a comparison.

    Example:

        llmlb run workloads/chat.toml

        llmlb run workloads/chat.toml -p round_robin -p least_outstanding --replicas 8 --slo ttft=1s,tpot=80ms

        llmlb run workloads/chat.toml -p random -p power_of_d --policy-arg power_of_d.d=3

    A plain --policy-arg key=value goes to every compared policy that has the
    parameter; NAME.key=value to policy NAME only.
    """
    from llmlb_bench.experiment import simulate_run
    from llmlb_bench.policies import args_per_policy, make_policy, parse_args
    from llmlb_bench.report.output import print_report
    from llmlb_bench.schema import read_trace, write_trace
    from llmlb_bench.store.run import new_run_id
    from llmlb_bench.workload import generate, load_spec

    policies = policy or DEFAULT_POLICIES
    args = args_per_policy(policies, parse_args(policy_arg))
    for name in policies:  # fail on a bad name or argument before any work is done
        make_policy(name, args[name])
    config = cluster.config()
    workload = load_spec(spec).replace(seed=seed)  # the stored spec records the seed actually used
    table = generate(workload)
    batch = new_run_id(spec.stem)
    trace_path = results / "traces" / f"{batch}.parquet"
    write_trace(table, trace_path, spec=workload.to_dict(), block_size=workload.block_size)
    table = read_trace(trace_path)
    if fmt is ReportFormat.terminal:
        console.print(f"trace: {table.num_rows:,} requests -> {trace_path}")
    dirs = []
    for name in policies:
        run_id = f"{batch}-{name.replace(':', '_').replace('.', '_')}"
        try:
            with working(err_console, f"simulating {table.num_rows:,} requests under {name}"):
                store = simulate_run(table, trace_path, config, name, args[name], workload.seed, results / batch,
                                     label=name, run_id=run_id, users=users, think_s=think_time)
        except KeyboardInterrupt:
            if (results / batch / run_id / "run.json").is_file():
                err_console.print(f"interrupted; the partial run of {name} (requests simulated so far) is kept in "
                                  f"{results / batch / run_id}, the finished ones beside it", highlight=False,
                                  soft_wrap=True)
            raise
        dirs.append(store.dir)
        if fmt is ReportFormat.terminal:
            console.print(f"simulated {name}: {store.summary.get('wall_s', 0):.2f} s -> {store.dir}")
    print_report(dirs, slo, fmt, console=console)
