"""``llmlb gen``: generate a trace from a workload spec."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.errors import UserError


@app.command()
def gen(
    spec: Annotated[Path, typer.Argument(help="Workload spec (TOML), e.g. workloads/chat.toml.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Trace Parquet file to write.")],
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed (default: the spec's own).")] = None,
    rate_scale: Annotated[float, typer.Option("--rate-scale",
                                              help="Multiply every arrival rate (time structure kept).")] = 1.0,
    requests: Annotated[Optional[int], typer.Option("--requests", "-n", min=1,
                                                    help="Number of requests (overrides the spec).")] = None,
    duration: Annotated[Optional[float], typer.Option("--duration",
                                                      help="Trace length in seconds (overrides the spec).")] = None,
) -> None:
    """Generate a trace from SPEC and write it atomically to --output.

    Example:

        llmlb gen workloads/chat.toml -o chat.parquet --seed 7 --rate-scale 1.5 --requests 10000
    """
    from llmlb_bench.schema import write_trace
    from llmlb_bench.workload import generate, load_spec
    from llmlb_bench.workload.stats import one_line

    if requests is not None and duration is not None:
        raise UserError("give --requests or --duration, not both")
    if rate_scale <= 0 or (duration is not None and duration <= 0):
        raise UserError("--rate-scale and --duration must be > 0")
    workload = load_spec(spec).replace(seed=seed, requests=requests, duration_s=duration)
    if rate_scale != 1.0:
        workload = workload.replace(rate_scale=workload.rate_scale * rate_scale)
    start = time.perf_counter()
    table = generate(workload)
    write_trace(table, output, spec=workload.to_dict(), block_size=workload.block_size)
    elapsed = time.perf_counter() - start
    console.print(f"{output}: {one_line(table)} (generated in {elapsed:.2f} s)", highlight=False, soft_wrap=True)
