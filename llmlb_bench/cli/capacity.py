"""``llmlb capacity``: the highest rate real endpoints serve within an SLO attainment target, within a budget."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Optional, TypeVar

import typer
from rich.console import Console

from llmlb_bench.cli.app import app, console, err_console
from llmlb_bench.cli.common import (Api, Executor, PolicyArgs, RayAddress, ReportFormat, ResultsDir, SloOpt,
                                    WorkerExecutor, Workers, check_workers, checked_name)
from llmlb_bench.console import Table
from llmlb_bench.errors import UserError
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.units import parse_duration

if TYPE_CHECKING:       # the command imports the search when it runs (start-up stays light)
    from llmlb_bench.sweep.endpoint_capacity import Probe, RepeatsSummary, SearchSummary

_LABEL = re.compile(r"[^A-Za-z0-9_-]+")


def parse_bracket(text: str) -> tuple[float, float]:
    """``LOW,HIGH`` in req/s, with 0 < LOW < HIGH."""
    parts = text.split(",")
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        raise UserError(f"cannot parse {text!r}; expected LOW,HIGH in req/s, e.g. 1,200", "--rate") from None
    if not 0 < low < high:
        raise UserError(f"needs 0 < LOW < HIGH, got {text!r}", "--rate")
    return low, high


@app.command()
def capacity(
    workload: Annotated[Path, typer.Argument(help="Workload spec (TOML), e.g. workloads/chat.toml; generated anew at each probe's rate.")],
    endpoint: Annotated[list[str], typer.Option(
        "--endpoint", "-e", help="Base URL of an OpenAI-compatible server (repeat for client-side routing over several).")],
    slo: SloOpt = None,
    rate: Annotated[Optional[str], typer.Option("--rate", help="Bracket of the search, LOW,HIGH in req/s.")] = None,
    attainment: Annotated[float, typer.Option("--attainment", min=0.0, max=1.0, help="Target: fraction of requests that meet the SLO.")] = 0.9,
    tolerance: Annotated[float, typer.Option("--tolerance", min=0.001, help="Stop when HIGH/LOW <= 1 + tolerance.")] = 0.05,
    probe_duration: Annotated[str, typer.Option("--probe-duration", help="Length of each probe's trace (30s, 2m); ignored with --probe-requests.")] = "30s",
    probe_requests: Annotated[Optional[int], typer.Option("--probe-requests", min=1, help="Requests per probe instead of a fixed duration.")] = None,
    budget: Annotated[Optional[str], typer.Option("--budget", help="Wall time for the whole search (10m, 1h); a probe that would not fit is not started.")] = None,
    budget_requests: Annotated[Optional[int], typer.Option("--budget-requests", min=1, help="Requests for the whole search.")] = None,
    cooldown: Annotated[str, typer.Option("--cooldown", help="Pause before each probe after the first; then wait until the endpoints' /metrics gauges show no running or waiting request.")] = "5s",
    warmup: Annotated[float, typer.Option("--warmup", min=0.0, max=0.9, help="Fraction of each probe's first requests sent but not judged (they meet an empty engine).")] = 0.1,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Routing policy over the endpoints (see llmlb policies).")] = "least_outstanding",
    policy_arg: PolicyArgs = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of the workload and the policy, the same at every probe (default: the spec's).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Searches with seeds SEED, SEED+1, ... within the one budget; reports their mean capacity and 95% interval.")] = 1,
    api: Annotated[Api, typer.Option("--api", help="Which API to call.")] = Api.chat,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model name to send (default: each endpoint's first /v1/models entry).")] = None,
    workers: Workers = 1,
    executor: Executor = WorkerExecutor.process,
    address: RayAddress = None,
    results: ResultsDir = Path("results"),
    name: Annotated[Optional[str], typer.Option("--name", callback=checked_name, help="Folder under --results (default: capacity-<workload>-<UTC time>); an earlier search's name resumes it, reusing its finished probes.")] = None,
    fmt: Annotated[ReportFormat, typer.Option("--format", "-f", help="Output format (terminal or json).")] = ReportFormat.terminal,
) -> None:
    """Find the highest request rate the ENDPOINTs serve with at least --attainment of requests within --slo, by geometric bisection over --rate, each probe a real open-loop replay.

    Every probe replays WORKLOAD generated at the probe's rate with the same seed (the same requests, compressed in time), is stored as an ordinary run under RESULTS/NAME/ (run.json config.sweep: phase capacity, rate), and is judged without its warm-up. The search stops early, censored 'budget', when the next probe would not fit in --budget or --budget-requests.

    Example:

        llmlb capacity workloads/chat.toml -e http://127.0.0.1:8000 -e http://127.0.0.1:8001 --slo ttft=500ms,tpot=50ms --rate 1,200 --probe-duration 30s --budget 20m

        llmlb capacity workloads/chat.toml -e http://127.0.0.1:8000 --slo ttft=1s --rate 2,50 --probe-requests 500 --budget-requests 5000 --format json

        llmlb capacity workloads/chat.toml -e http://127.0.0.1:8000 --slo ttft=500ms --rate 2,50 --repeats 3 --budget 1h
    """
    from llmlb_bench.policies import make_policy, parse_args
    from llmlb_bench.replay import ReplayOptions, preflight
    from llmlb_bench.sweep.endpoint_capacity import EndpointSearch, run_repeats, run_search
    from llmlb_bench.workload import load_spec

    if not slo:
        raise UserError("a capacity search needs an SLO, e.g. --slo ttft=500ms,tpot=50ms", "--slo")
    Slo.parse(slo)
    if rate is None:
        raise UserError("give the bracket of the search, e.g. --rate 1,200", "--rate")
    low, high = parse_bracket(rate)
    pause = parse_duration(cooldown, "--cooldown")
    seconds = parse_duration(budget, "--budget") if budget is not None else None
    probe_s = parse_duration(probe_duration, "--probe-duration")
    if probe_s <= 0 and probe_requests is None:
        raise UserError("must be positive", "--probe-duration")
    spec = load_spec(workload)
    spec = spec.replace(requests=probe_requests) if probe_requests else spec.replace(duration_s=probe_s)
    args = parse_args(policy_arg)
    make_policy(policy, args)   # a wrong policy or argument stops here, before any request is sent
    check_workers(workers, executor, address)
    options = ReplayOptions(api=api.value, model=model, workers=workers, executor=executor.value, address=address)
    label = _LABEL.sub("-", workload.stem) or "workload"
    search = EndpointSearch(
        name=name or f"capacity-{label}-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}", workload=label,
        spec=spec, endpoints=list(endpoint), slo=slo, target=attainment, low=low, high=high, tolerance=tolerance,
        policy=policy, policy_args=args, seed=spec.seed if seed is None else seed, options=options,
        cooldown_s=pause, warmup=warmup, budget_s=seconds, budget_requests=budget_requests)
    pre = preflight(search.endpoints, options)
    for note in pre.notes:
        err_console.print(f"[yellow]warning:[/] {note}", highlight=False, soft_wrap=True)
    try:
        if repeats == 1:
            _show(run_search(search, results, pre, _print_probe), fmt, render)
        else:
            _show(run_repeats(search, repeats, results, pre, _print_probe), fmt, render_repeats)
    except KeyboardInterrupt:
        err_console.print(f"search interrupted; finished probes are kept in {Path(results) / search.name}, "
                          f"and the same command with --name {search.name} resumes it", highlight=False,
                          soft_wrap=True)
        raise


S = TypeVar("S")


def _show(summary: S, fmt: ReportFormat, render_terminal: Callable[[S, Console], None]) -> None:
    """The summary as JSON on stdout, or rendered for the terminal."""
    if fmt is ReportFormat.json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        render_terminal(summary, console)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{1e3 * v:,.1f}"


def _print_probe(p: Probe) -> None:
    err_console.print(_probe_line(p), highlight=False)


def _probe_line(p: Probe) -> str:
    verdict = "meets" if p["meets"] else "misses"
    how = "sent" if p["ran"] else "reused"
    busy = "; the endpoints were still busy when it started" if p["drained"] is False else ""
    return (f"probe {p['rate']:,.3g} req/s: attainment {_pct(p['attainment'])} -> {verdict} "
            f"({p['requests']} requests {how}, run {p['run_id']}{busy})")


def _bracket(bracket: list[float | None] | None) -> str:
    """A search's bracket (None while it runs); its open high end is infinite."""
    if bracket is None:
        return "-"
    low, high = bracket
    return f"[{low:,.3g}, {'inf' if high is None else format(high, ',.3g')}]"


def render(summary: SearchSummary, out: Console) -> None:
    """The verdict line, then one row per probe in the order made."""
    bracket = f"{_bracket(summary['bracket'])} req/s"
    note = {"below": "misses the target at the lowest rate", "above": "meets it at the highest rate (lower bound)",
            "budget": "budget spent before the bracket closed"}.get(summary["censored"] or "", "")
    cap = summary["capacity"]
    out.print(f"capacity [bold]{'none' if cap is None else format(cap, ',.3g') + ' req/s'}[/] at "
              f"{100 * summary['target']:g}% attainment of {summary['slo']}; bracket {bracket}"
              + (f"; censored: {summary['censored']} ({note})" if summary["censored"] else ""))
    spent = summary["spent"]
    out.print(f"{len(summary['probes'])} probes, {spent['requests']:,} requests sent, {spent['seconds']:,.1f} s "
              f"-> {summary['root']}", highlight=False)
    t = Table(title=f"Probes in the order made, against {', '.join(summary['endpoints'])} "
                    f"({summary['policy']['name']}); goodput in req/s", title_justify="left")
    for col in ("req/s", "requests", "attained", "goodput", "TTFT p90 ms", "TPOT p90 ms"):
        t.add_column(col, justify="right")
    t.add_column("meets")
    t.add_column("run id", overflow="fold")
    for p in summary["probes"]:
        t.add_row(f"{p['rate']:,.3g}", f"{p['requests']:,}", _pct(p["attainment"]),
                  "-" if p["goodput"] is None else f"{p['goodput']:,.2f}", _ms(p["ttft_p90"]), _ms(p["tpot_p90"]),
                  "yes" if p["meets"] else "no", p["run_id"] + ("" if p["ran"] else " (reused)"))
    out.print(t)


def render_repeats(summary: RepeatsSummary, out: Console) -> None:
    """The mean capacity and its interval, then one row per seed (each seed's probes are in its summary.json)."""
    mean = summary["mean"]
    interval = ("" if summary["low"] is None
                else f" (95% interval {summary['low']:,.3g} to {summary['high']:,.3g})")
    out.print(f"capacity [bold]{'none' if mean is None else format(mean, ',.3g') + ' req/s'}[/]{interval}, mean "
              f"of {summary['n']} seed{'s' if summary['n'] != 1 else ''}, at {100 * summary['target']:g}% "
              f"attainment of {summary['slo']}"
              + (f"; censored seeds: {', '.join(summary['censored'])}" if summary["censored"] else "")
              + (f"; not measured within the budget: seeds {', '.join(map(str, summary['not_measured']))}"
                 if summary["not_measured"] else ""))
    spent = summary["spent"]
    out.print(f"{spent['requests']:,} requests sent, {spent['seconds']:,.1f} s -> {summary['root']}", highlight=False)
    t = Table(title="Per seed", title_justify="left")
    for col in ("seed", "capacity req/s", "bracket req/s", "censored", "probes", "requests"):
        t.add_column(col, justify="right")
    t.add_column("summary", overflow="fold")
    for r in summary["per_seed"]:
        t.add_row(str(r["seed"]), "-" if r["capacity"] is None else f"{r['capacity']:,.3g}",
                  _bracket(r["bracket"]), r["censored"] or "",
                  str(r["probes"]), f"{r['requests']:,}", r["summary"])
    out.print(t)
