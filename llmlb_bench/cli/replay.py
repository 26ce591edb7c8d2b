"""``llmlb replay``: send a trace to real OpenAI-compatible endpoints and store what happened."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Mapping, Optional
from urllib.parse import urlsplit

import typer
from rich.markup import escape
from rich.text import Text

from llmlb_bench.cli.app import app, console, err_console
from llmlb_bench.cli.common import (Api, Executor, ForceLength, PolicyArgs, RayAddress, ReportFormat, ResultsDir, RunId, Seed,
                                    SloOpt, ThinkTime, Users, WorkerExecutor, Workers, check_workers)
from llmlb_bench.errors import UserError
from llmlb_bench.redact import redact

if TYPE_CHECKING:
    from llmlb_bench.run_summary import ClientSummary, ReplaySummary
    from llmlb_bench.replay.options import ReplayProgress


def _timeout(value: float | None) -> float | None:
    """0 on the command line means "no timeout"."""
    return None if value is None or value <= 0 else value


@app.command()
def replay(
    trace: Annotated[Path, typer.Argument(help="Trace Parquet file (from llmlb gen or llmlb trace import).")],
    endpoint: Annotated[list[str], typer.Option(
        "--endpoint", "-e", help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000 "
                                 "(repeat for client-side routing over several).")],
    policy: Annotated[str, typer.Option("--policy", "-p", help="Routing policy over the endpoints (see llmlb policies).")] = "least_outstanding",
    policy_arg: PolicyArgs = None,
    seed: Seed = 0,
    api: Annotated[Api, typer.Option("--api", help="Which API to call.")] = Api.chat,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Model name to send (default: each endpoint's first /v1/models entry).")] = None,
    time_scale: Annotated[float, typer.Option("--time-scale", help="Multiply trace times by this (0.5 = twice the rate).")] = 1.0,
    users: Users = None,
    think_time: ThinkTime = 0.0,
    workers: Workers = 1,
    executor: Executor = WorkerExecutor.process,
    address: RayAddress = None,
    api_key_env: Annotated[Optional[str], typer.Option("--api-key-env", help="Environment variable with the API key (default: OPENAI_API_KEY if set). The key is never stored.")] = None,
    tokenize: Annotated[bool, typer.Option("--tokenize", help="Use the first endpoint's /tokenize for exact prompt lengths.")] = False,
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", help="A local tokenizer.json (or a folder holding one) for exact prompt lengths; needs the 'tokenizers' package (extra 'tokenizer').")] = None,
    force_length: ForceLength = True,
    thread: Annotated[bool, typer.Option("--thread/--no-thread", help="Build a dependent request's prompt from its parent's prompt and the answer the server returned (conversations, agents), so the server's prefix cache sees the reply's sharing; --no-thread materialises every prompt from the trace's hashes.")] = True,
    connect_timeout: Annotated[float, typer.Option("--connect-timeout", help="Seconds to open a connection (0: none).")] = 10.0,
    first_token_timeout: Annotated[float, typer.Option("--first-token-timeout", help="Seconds from send to the first token (0: none).")] = 600.0,
    token_timeout: Annotated[float, typer.Option("--token-timeout", help="Longest silence between tokens, seconds (0: none).")] = 120.0,
    total_timeout: Annotated[float, typer.Option("--total-timeout", help="Seconds for a whole request (0: none).")] = 0.0,
    retries: Annotated[int, typer.Option("--retries", min=0, help="Extra attempts after HTTP 429/5xx or a failed connection.")] = 0,
    retry_backoff: Annotated[float, typer.Option("--retry-backoff", min=0.0, help="Seconds before the first retry (doubles each time; Retry-After wins if larger).")] = 0.5,
    scrape: Annotated[float, typer.Option("--scrape-interval", help="Seconds between reads of each endpoint's Prometheus /metrics (load signals for policies, series.parquet); 0: off.")] = 1.0,
    power_source: Annotated[Optional[list[str]], typer.Option("--power-source", help="Energy: nvml[:0,1] (local GPUs' energy counters; extra 'nvml'), prometheus:URL (a DCGM exporter) or constant:WATTS; once for the fleet or once per --endpoint. Power goes to series.parquet, energy to each request's energy_j.")] = None,
    power_interval: Annotated[float, typer.Option("--power-interval", min=0.05, help="Seconds between power readings.")] = 1.0,
    self_check: Annotated[float, typer.Option("--self-check", min=0.0, help="First replay this many seconds of the trace against a local no-op server to measure the client's own lateness and TTFT inflation (stored in run.json).")] = 0.0,
    resume: Annotated[Optional[Path], typer.Option("--resume", help="Continue this partial replay run folder (same trace): finished rows are kept, the rest is sent.")] = None,
    results: ResultsDir = Path("results"),
    run_id: RunId = None,
    label: Annotated[Optional[str], typer.Option("--label", help="Short name shown in reports (default: policy).")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Live counters on stderr (when it is a terminal).")] = True,
    slo: SloOpt = None,
) -> None:
    """Replay TRACE against real endpoints, open loop, and store the run under --results.

    Every request leaves at its trace time (scaled by --time-scale) whatever the server does, streams its answer, and gets exactly one result row (ok, error, timeout, rejected, not_sent). Ctrl-C or SIGTERM stops cleanly: the run is kept as partial and --resume continues it.

    Example:

        llmlb replay trace.parquet -e http://127.0.0.1:8000 -e http://127.0.0.1:8001 --policy least_outstanding --time-scale 0.5

    Load from 8 machines of a Ray cluster (llmlb-bench installed on each node):

        llmlb replay trace.parquet -e http://10.0.0.5:8000 --workers 8 --executor ray --address auto
    """
    from rich.live import Live

    from llmlb_bench.experiment import RunInterrupted, replay_run
    from llmlb_bench.policies import make_policy, parse_args
    from llmlb_bench.replay import ReplayOptions, Timeouts, preflight, prepare_resume
    from llmlb_bench.replay.power import open_sources
    from llmlb_bench.replay.selfcheck import self_check as run_self_check
    from llmlb_bench.report.output import print_report
    from llmlb_bench.schema import read_trace

    if time_scale <= 0:
        raise UserError("must be positive", "--time-scale")
    check_workers(workers, executor, address)
    if resume is not None and run_id is not None:
        raise UserError("--resume continues an existing run id; drop --run-id", "--run-id")
    options = ReplayOptions(
        api=api.value, model=model, time_scale=time_scale, users=users, think_s=think_time, workers=workers,
        executor=executor.value, address=address,
        force_output_length=force_length, thread=thread,
        api_key_env=api_key_env, tokenize=tokenize,
        tokenizer=str(tokenizer) if tokenizer is not None else None, retries=retries, retry_backoff_s=retry_backoff,
        scrape_s=scrape if scrape > 0 else None, power_sources=list(power_source or []),
        power_interval_s=power_interval,
        timeouts=Timeouts(connect=_timeout(connect_timeout), first_token=_timeout(first_token_timeout),
                          between_tokens=_timeout(token_timeout), total=_timeout(total_timeout)))
    table = read_trace(trace)
    policy_args = parse_args(policy_arg)
    pol = make_policy(policy, policy_args, seed=seed)   # a bad --policy or --policy-arg stops before the preflight
    if scrape <= 0:
        from llmlb_bench.policies.learned import check_sources
        check_sources(pol, set(), "--scrape-interval")
    pre = preflight(endpoint, options, table)
    power = open_sources(options.power_sources, [ep.url for ep in pre.endpoints]) if power_source else None
    for note in pre.notes:
        err_console.print(f"[yellow]warning:[/] {escape(redact(note))}", highlight=False, soft_wrap=True)
    check = None
    if self_check > 0:
        check = run_self_check(table, options, self_check, options.lag_threshold_ms)
        lat, infl = check["send_lateness_ms"], check["ttft_inflation_ms"]
        err_console.print(f"self-check ({check['ok']} requests on a local no-op server): send lateness p99 "
                          f"{lat['p99']} ms, TTFT inflation p99 {infl['p99']} ms"
                          + (f" [bold red](over the {options.lag_threshold_ms:g} ms threshold: this client cannot "
                             "keep this schedule)[/]" if check["flagged"] else ""), highlight=False, soft_wrap=True)
    res = prepare_resume(resume, trace) if resume is not None else None
    live = Live(Text(""), console=err_console, auto_refresh=False, transient=True) \
        if progress and err_console.is_terminal else None
    if live is not None:
        options.progress = lambda c: live.update(_progress_line(c), refresh=True)
    try:
        with live if live is not None else nullcontext():
            store = replay_run(table, trace, pre, policy, policy_args, seed, results, options,
                               label=label or default_label(pre.endpoints[0].url, policy, len(pre.endpoints)),
                               run_id=run_id, resume=res, power=power,
                               self_check=check)
    except RunInterrupted as exc:
        err_console.print(f"run kept as partial in {exc.run_dir}; continue it with --resume {exc.run_dir}",
                          highlight=False, soft_wrap=True)
        raise
    console.print(f"stored run [bold]{store.run_id}[/] in {store.dir}")
    console.print(sent_line(store.summary["replay"], store.summary["client"]), highlight=False)
    energy = store.summary.get("energy")
    if energy:
        console.print(f"energy {energy['energy_j'] / 1e3:,.3f} kJ: {energy['attributed_j'] / 1e3:,.3f} kJ attributed "
                      f"to requests, {energy['idle_j'] / 1e3:,.3f} kJ idle")
    print_report([store.dir], slo, ReportFormat.terminal, console=console)


def default_label(url: str, policy: str, endpoints: int) -> str:
    """A run's label when --label is not given: the routing policy when the client routes over several
    endpoints; with one endpoint the client routes nothing (whatever is behind it does), so the
    endpoint's host:port."""
    return policy if endpoints > 1 else (urlsplit(url).netloc or url)


def statuses_text(statuses: Mapping[str, int]) -> str:
    """Request statuses as a person reads them: '148 ok, 2 timeout', most frequent first."""
    ranked = sorted(statuses.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{n:,} {status}" for status, n in ranked) or "none"


def sent_line(replay: ReplaySummary, client: ClientSummary) -> str:
    """What was sent and how it ended, and whether the client itself was late (naming the threshold)."""
    lag = client["dispatch_lag_ms"]
    over = (f" [bold red](over the {client['lag_threshold_ms']:g} ms threshold: the client was the bottleneck)[/]"
            if client["flagged"] else "")
    return (f"sent {replay['sent']:,} requests at {replay['send_rate_rps'] or 0:.1f}/s: "
            f"{statuses_text(replay['statuses'])}; dispatch lag p99 {lag['p99']} ms{over}")


def _progress_line(c: ReplayProgress) -> Text:
    ttft = f"{c['ttft_p50_ms']:.1f} ms" if c["ttft_p50_ms"] is not None else "-"
    return Text(f"sent {c['sent']}/{c['total']}  in flight {c['in_flight']}  done {c['done']}  "
                f"errors {c['errors']}  TTFT p50 {ttft}")
