"""``llmlb route``: llmlb's routing policies as a live OpenAI-compatible proxy in front of real engines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional
from urllib.parse import urlsplit

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import PolicyArgs, Seed
from llmlb_bench.errors import UserError


def _backend(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise UserError(f"{url!r} is not http://HOST:PORT", "--backend")
    return url.rstrip("/")


@app.command()
def route(
    backend: Annotated[list[str], typer.Option("--backend", "-b", help="Engine URL http://HOST:PORT (repeatable).")],
    policy: Annotated[str, typer.Option("--policy", "-p", help="Routing policy (see llmlb policies).")] = "least_outstanding",
    policy_arg: PolicyArgs = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind (default: loopback only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: any free port).")] = 8080,
    results: Annotated[Path, typer.Option("--results", help="Results folder; the run goes to RESULTS/RUN_ID/.")] = Path("results"),
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="Run folder name (default: from --label and the time).")] = None,
    label: Annotated[str, typer.Option("--label", help="Run label.")] = "route",
    scrape_s: Annotated[float, typer.Option("--scrape-interval", help="Seconds between scrapes of each backend's /metrics (0: never).")] = 1.0,
    health_s: Annotated[float, typer.Option("--health-interval", help="Seconds between health checks (GET /health).")] = 1.0,
    retries: Annotated[int, typer.Option("--retries", min=0, help="Other backends tried when a connection is refused.")] = 1,
    drain_s: Annotated[float, typer.Option("--drain-timeout", help="Seconds SIGTERM waits for requests in flight.")] = 30.0,
    seed: Seed = 0,
) -> None:
    """Route OpenAI-compatible requests to BACKENDs with an llmlb policy and record each as a results row.

    Any client's traffic becomes an llmlb run (requests.parquet with the backend of each request,
    series.parquet with each backend's queue and KV) that report, query and gate read. SIGTERM or
    Ctrl-C drains: listening stops, requests in flight finish, run.json says complete.

    Example:

        llmlb route -b http://127.0.0.1:8001 -b http://127.0.0.1:8002 -p cache_aware --port 8080
    """
    from llmlb_bench.policies import make_policy, parse_args
    from llmlb_bench.proxy import RouteOptions, serve_forever
    from llmlb_bench.store import RunStore

    urls = [_backend(b) for b in backend]
    if not scrape_s >= 0:
        raise UserError(f"must be >= 0, got {scrape_s!r}", "--scrape-interval")
    if not health_s > 0:
        raise UserError(f"must be > 0, got {health_s!r}", "--health-interval")
    pol = make_policy(policy, parse_args(policy_arg), seed=seed)
    if scrape_s == 0:
        from llmlb_bench.policies.learned import check_sources
        check_sources(pol, set(), "--scrape-interval")
    opts = RouteOptions(host=host, port=port, scrape_s=scrape_s, health_s=health_s, retries=retries, drain_s=drain_s)
    config = {"policy": policy, "policy_args": parse_args(policy_arg), "seed": seed, "backends": urls,
              "route": {"host": host, "port": port, "scrape_s": scrape_s, "health_s": health_s, "retries": retries}}
    with RunStore(results, config=config, backend="route", label=label, run_id=run_id) as run:
        counts = serve_forever(urls, pol, run, opts,
                               announce=lambda line: console.print(line, highlight=False, soft_wrap=True))
        console.print(f"stopped: {counts} -> {run.dir}", highlight=False, soft_wrap=True)
