"""``llmlb trace import|stats|fit``: bring real traces in, characterise them, fit specs to them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Mapping, Optional

import typer

from llmlb_bench.cli.lazy import Group
from llmlb_bench.cli.app import app, console
from llmlb_bench.console import Table
from llmlb_bench.errors import UserError
from llmlb_bench.trace_formats import FORMATS, check_format

if TYPE_CHECKING:
    from llmlb_bench.tomlfile import Value

trace_app = typer.Typer(help="Import real traces, characterise traces, fit workload specs to them.\n\n"
                        "Example:  llmlb trace import mooncake conversation_trace.jsonl -o mc.parquet && "
                        "llmlb trace stats mc.parquet", no_args_is_help=True, cls=Group)
app.add_typer(trace_app, name="trace")


@trace_app.command("import")
def import_(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help="One of: " + ", ".join(FORMATS) + ".")],
    source: Annotated[Path, typer.Argument(metavar="FILE", help="The trace file (a directory for servegen).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Trace Parquet file to write.")],
    tenant: Annotated[Optional[str], typer.Option(help="Set every request's tenant.")] = None,
    kind: Annotated[Optional[str], typer.Option(help="Set every request's kind (e.g. code, chat).")] = None,
    drop_failed: Annotated[bool, typer.Option("--drop-failed", help="burstgpt: drop failed requests "
                                              "(zero response tokens) instead of keeping them.")] = False,
    rate: Annotated[float, typer.Option(help="sharegpt: arrival rate (req/s or sessions/s).")] = 10.0,
    process: Annotated[str, typer.Option(help="sharegpt: poisson, gamma or weibull arrivals.")] = "poisson",
    cv: Annotated[float, typer.Option(help="sharegpt: inter-arrival CV for gamma/weibull.")] = 1.0,
    multi_turn: Annotated[bool, typer.Option("--multi-turn", help="sharegpt: every exchange as a dependent "
                                             "turn of a session (default: first exchange only).")] = False,
    think_s: Annotated[float, typer.Option(help="sharegpt: mean think time between turns (s).")] = 30.0,
    chars_per_token: Annotated[float, typer.Option(help="sharegpt: characters per token.")] = 4.0,
    seed: Annotated[int, typer.Option(help="sharegpt/servegen: seed of the generated arrivals.")] = 0,
    spec_out: Annotated[Optional[Path], typer.Option("--spec-out", help="servegen: also write the spec (TOML).")] = None,
    limit: Annotated[Optional[int], typer.Option(
        "--limit", help="Keep only the first N requests (in arrival order).")] = None,
    duration: Annotated[Optional[float], typer.Option(
        "--duration", help="Keep only the requests arriving in the first S seconds.")] = None,
) -> None:
    """Convert a public trace to the llmlb trace format.

    Example:

        llmlb trace import azure-2023 AzureLLMInferenceTrace_code.csv -o code.parquet --kind code

        llmlb trace import sharegpt ShareGPT_V3.json -o sharegpt.parquet --rate 8 --multi-turn

        llmlb trace import servegen servegen/deepseek-r1 -o r1.parquet --duration 600 --limit 5000
    """
    from llmlb_bench.schema import write_trace
    from llmlb_bench.tomlfile import dumps_toml
    from llmlb_bench.workload.importers import import_trace
    from llmlb_bench.workload.stats import one_line

    check_format(fmt)
    if process not in ("poisson", "gamma", "weibull"):
        raise UserError(f"--process must be poisson, gamma or weibull, not {process!r}")
    if not (0.05 < cv < 20) or chars_per_token <= 0 or think_s < 0:
        raise UserError("--cv must be in (0.05, 20), --chars-per-token > 0 and --think-s >= 0")
    start = time.perf_counter()
    result = import_trace(fmt, source, kind=kind, tenant=tenant, drop_failed=drop_failed, rate=rate,
                          process=process, cv=cv, seed=seed, multi_turn=multi_turn, think_s=think_s,
                          chars_per_token=chars_per_token, limit=limit, duration_s=duration)
    write_trace(result.table, output, spec=result.spec, block_size=result.block_size)
    if spec_out is not None:
        if result.spec is None:
            raise UserError("--spec-out only applies to formats that generate from a spec (servegen)")
        spec_out.write_text(dumps_toml(result.spec, comment=f"Workload spec imported from {source}"))
    console.print(f"{output}: {one_line(result.table)} (imported in {time.perf_counter() - start:.2f} s)",
                  highlight=False, soft_wrap=True)


@trace_app.command()
def stats(
    trace: Annotated[Path, typer.Argument(help="Trace Parquet file.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    plots: Annotated[Optional[Path], typer.Option("--plots", help="Write SVG plots into this directory.")] = None,
) -> None:
    """Characterise a trace: rate, burstiness, length tails, correlation, prefix reuse, sessions.

    Example:

        llmlb trace stats code.parquet --plots plots/
    """
    from llmlb_bench.schema import read_trace
    from llmlb_bench.workload.plots import write_plots
    from llmlb_bench.workload.stats import trace_stats

    table = read_trace(trace)
    figures = trace_stats(table)
    if plots is not None:
        figures["plots"] = [str(p) for p in write_plots(table, plots)]
    if json_out:
        console.print_json(json.dumps(figures))
        return
    console.print(_stats_table(figures, str(trace)))


def _fmt(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


#: Above this Hill alpha the largest values are nearly equal: the lengths are capped or
#: light-tailed, and the number itself says nothing (it grows without bound as the top flattens).
BOUNDED_ALPHA = 20.0


def _tail(alpha: Value) -> str:
    bounded = isinstance(alpha, (int, float)) and alpha > BOUNDED_ALPHA
    return f"> {BOUNDED_ALPHA:g} (bounded or light tail)" if bounded else _fmt(alpha)


def _part(f: Mapping[str, Value], key: str) -> Mapping[str, Value]:
    """One table of a trace's figures (workload/stats.py's), empty where the trace has none."""
    part = f.get(key, {})
    assert isinstance(part, Mapping), key
    return part


def _stats_table(f: Mapping[str, Value], title: str) -> Table:
    table = Table(title=title, show_header=True)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("requests", "span_s", "rate_rps", "interarrival_cv", "hurst"):
        table.add_row(key, _fmt(f.get(key)))
    for w, v in _part(f, "idc").items():
        table.add_row(f"index of dispersion @ {w}", _fmt(v))
    for col in ("input_tokens", "output_tokens"):
        q = _part(f, col)
        table.add_row(f"{col} mean / p50 / p90 / p99 / max",
                      " / ".join(_fmt(q[k]) for k in ("mean", "p50", "p90", "p99", "max")))
        table.add_row(f"{col} Hill tail index", _tail(q["hill_alpha"]))
    for key in ("io_spearman", "io_pearson_log", "dependent_requests"):
        if key in f:
            table.add_row(key, _fmt(f[key]))
    for group in ("prefix", "sessions", "joins", "images", "reasoning", "adapters"):
        for k, v in _part(f, group).items():
            table.add_row(f"{group}.{k}", _fmt(v))
    table.add_row("tenants", ", ".join(f"{k}: {v:,}" for k, v in list(_part(f, "tenants").items())[:8]))
    table.add_row("kinds", ", ".join(f"{k}: {v:,}" for k, v in _part(f, "kinds").items()))
    plots = f.get("plots")
    for p in plots if isinstance(plots, list) else []:
        table.add_row("plot", str(p))
    return table


@trace_app.command()
def fit(
    trace: Annotated[Path, typer.Argument(help="Trace Parquet file.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Workload spec (TOML) to write.")],
    window: Annotated[Optional[float], typer.Option("--window", help="Arrival window in seconds "
                                                    "(default 600, shorter for short traces).")] = None,
    seed: Annotated[int, typer.Option(help="Seed written into the spec and used for scoring.")] = 0,
    check: Annotated[bool, typer.Option("--check/--no-check", help="Generate from the fitted spec and "
                                        "compare it with the trace.")] = True,
) -> None:
    """Fit a workload spec to a trace, so look-alike traces can be generated at any scale and rate.

    Example:

        llmlb trace fit conv.parquet -o conv-fit.toml && llmlb gen conv-fit.toml -o look-alike.parquet --rate-scale 2
    """
    # the fitting code needs scipy.stats (half a second to import): loaded only by this command
    from llmlb_bench.schema import read_trace
    from llmlb_bench.store.run import write_text_atomic
    from llmlb_bench.tomlfile import dumps_toml
    from llmlb_bench.workload import WorkloadSpec, generate
    from llmlb_bench.workload.fit import compare, fit_trace
    from llmlb_bench.workload.stats import one_line

    if window is not None and window <= 0:
        raise UserError("--window must be > 0")
    table = read_trace(trace)
    result = fit_trace(table, window_s=window, seed=seed, name=f"fit-{trace.stem}")
    comment = [f"Fitted by `llmlb trace fit` to {trace.name}: {one_line(table)}."]
    view = Table(title=f"fit of {trace}")
    for col in ("tenant", "requests", "req/s", "input dist", "input KS", "output dist", "output KS", "io rho"):
        view.add_column(col, justify="right" if col not in ("tenant", "input dist", "output dist") else "left")
    for name, r in result.report["tenants"].items():
        view.add_row(name, f"{r['requests']:,}", f"{r['rate_rps']:.3g}", r["input"]["dist"], f"{r['input']['ks']:.4f}",
                     r["output"]["dist"], f"{r['output']['ks']:.4f}", f"{r['io_correlation']:.3f}")
        comment.append(f"tenant {name}: input {r['input']['dist']} (KS {r['input']['ks']:.4f}), "
                       f"output {r['output']['dist']} (KS {r['output']['ks']:.4f})")
    console.print(view)
    if check:
        generated = generate(WorkloadSpec.from_dict(result.spec, str(output)))
        c = compare(table, generated)
        line = (f"generated look-alike: input KS {c['input_ks']:.4f}, output KS {c['output_ks']:.4f}, "
                f"mean rate x{c['rate_ratio']:.4f}, {c['requests_generated']:,} vs {c['requests_original']:,} requests")
        console.print(line, highlight=False, soft_wrap=True)
        comment.append(line)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}", soft_wrap=True)
        comment.append(f"note: {note}")
    write_text_atomic(output, dumps_toml(result.spec, comment="\n".join(comment)))
    console.print(f"wrote {output}", highlight=False)
