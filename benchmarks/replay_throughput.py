"""How fast and how exact is the replayer? Measured against a no-op server whose clock is the truth.

The no-op streaming server (llmlb_bench.replay.noop_server) runs in its own
process pinned to one core; the replayer runs here, pinned to another, doing
all of its real work (routing, accounting, Parquet rows). Both read the same
system-wide monotonic clock, so for every request::

    send lateness   = sent_s - scheduled_s                     (client only)
    TTFT inflation  = client first-token time - server first-token write time

Three figures, each with 32 streamed output tokens per request:

* capacity: requests/s completed when the offered load exceeds what one
  client core can do (the whole response arrives at once, so this is the
  client's per-request cost);
* open loop at 500 and 1,000 requests/s (Poisson arrivals, tokens 2 ms apart):
  achieved send rate against the trace's rate, send lateness and TTFT
  inflation percentiles;
* worker scaling (``--workers 1 2 ...``): the capacity run again with N
  client processes (``ReplayOptions.workers``), one core per process: N=1
  on the client core alone, N>1 on every core of the machine (with only 2
  cores, the second is shared with the server, which costs about a quarter
  of what the client does per request). Client CPU per request, summed over
  the workers, is the figure that does not depend on the cores available.

    flock /tmp/llmlb-measure.lock python benchmarks/replay_throughput.py [--seconds 10] [--capacity-requests 20000]
        [--rates 500 1000] [--workers 1 2] [--profile]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from llmlb_bench.eventloop import new_event_loop
from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, preflight, replay
from llmlb_bench.replay.selfcheck import client_figures, noop_server, server_records
from llmlb_bench.schema import TRACE
from llmlb_bench.store import RunStore

if TYPE_CHECKING:  # only the annotation of profile_breakdown: --profile imports it when it runs
    import cProfile

OUTPUT_TOKENS = 32


def trace(n: int, rate: float | None, seed: int = 0, input_tokens: int = 128) -> pa.Table:
    """``n`` requests; Poisson arrivals at ``rate``, or all at time 0 (rate None)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n)) if rate else np.zeros(n)
    return TRACE.conform(pa.table({
        "request_id": pa.array(np.arange(n), pa.int64()),
        "arrival_s": pa.array(arrivals - arrivals[0]),
        "input_tokens": pa.array(np.full(n, input_tokens), pa.int32()),
        "output_tokens": pa.array(np.full(n, OUTPUT_TOKENS), pa.int32()),
        "prefix_hashes": pa.array([[i % 50, 1000 + i] for i in range(n)], pa.list_(pa.uint64())),
    }), "bench")


def run(table: pa.Table, url: str, results: Path, name: str, workers: int = 1) -> tuple[dict, pa.Table]:
    options = ReplayOptions(api="chat", workers=workers)
    pre = preflight([url], options)
    with RunStore(results, config={}, backend="replay", run_id=name) as store:
        summary = replay(table, [url], make_policy("round_robin"), store, options, pre=pre)
    return summary, pq.read_table(store.dir / "requests.parquet")


def machine_noise(cpu: int, seconds: float = 3.0) -> None:
    """How often this core is taken away from a bare busy loop (shared machines and VMs steal time).

    Any client's lateness and inflation percentiles can be no better than this."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    gaps, end = [], time.perf_counter() + seconds
    last = time.perf_counter()
    while last < end:
        now = time.perf_counter()
        if now - last > 0.0005:
            gaps.append(now - last)
        last = now
    g = np.array(gaps or [0.0]) * 1e3
    print(f"machine noise on CPU {cpu}: a bare busy loop lost the core {len(gaps) / seconds:.0f} times/s "
          f"(> 0.5 ms), {g.sum() / seconds / 10:.1f}% of the time, longest {g.max():.1f} ms")


#: where a request's client time goes: (label, functions whose cumulative time counts there)
PROFILE_PARTS = (
    ("response: HTTP framing, SSE, JSON, tokens, the row", (("http.py", "data_received"),)),
    ("  of which the end: outcome, result row", (("runner.py", "finished"),)),
    ("request: routing, prompt text, JSON body, send", (("runner.py", "_dispatch"),)),
)


def profile_breakdown(prof: "cProfile.Profile", n: int) -> None:
    """Cumulative time per request of the hot path's parts (cProfile adds its own overhead:
    the shares, not the absolute figures, are what it tells)."""
    import pstats

    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    cum: dict[tuple[str, str], float] = {}
    for (path, _, name), (_, _, _, ct, _) in stats.items():
        key = (os.path.basename(path), name)
        cum[key] = cum.get(key, 0.0) + ct
    total = cum.get(("runner.py", "run"), 0.0)
    print(f"profile of the capacity run ({n} requests): {total / n * 1e6:.0f} us/request under cProfile")
    for label, keys in PROFILE_PARTS:
        t = sum(cum.get(k, 0.0) for k in keys)
        print(f"  {label:55s} {t / n * 1e6:6.1f} us/request  {100 * t / total:5.1f}%")
    for key in (("http.py", "_feed_chunked"), ("sse.py", "feed"), ("flight.py", "_on_events"),
                ("runner.py", "_request_bytes"), ("http.py", "send"), ("runner.py", "_write_row")):
        print(f"    {key[0]}:{key[1]:20s} {cum.get(key, 0.0) / n * 1e6:6.1f} us/request (cumulative)")


def capacity(args: argparse.Namespace, results: Path, workers: int = 1) -> float:
    """Streamed requests/s completed when more is offered than the client can do."""
    offered = args.capacity_offered * workers
    with noop_server(args.server_cpu, itl_ms=0.0) as url:
        table = trace(args.capacity_requests * workers, rate=offered)
        if args.profile and workers == 1:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
            run(table, url, results, "profile", workers)
            prof.disable()
            profile_breakdown(prof, table.num_rows)
        summary, rows = run(table, url, results, f"capacity-{workers}", workers)
    ok = rows.filter(pa.compute.equal(rows.column("status"), "ok"))
    sent = np.asarray(ok.column("sent_s"))
    last = np.asarray(ok.column("last_token_s"))
    rps = ok.num_rows / (last.max() - sent.min())
    print(f"capacity with {workers} client process{'es' if workers > 1 else ''}: {ok.num_rows}/{rows.num_rows} ok, "
          f"{rps:,.0f} streamed requests/s completed (offered {offered:,.0f}/s, {OUTPUT_TOKENS} tokens each); "
          f"client CPU {summary['client']['cpu_ms_per_request'] * 1e3:.0f} us/request; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    return rps


def open_loop(args: argparse.Namespace, results: Path, rate: float) -> None:
    with noop_server(args.server_cpu, itl_ms=args.itl_ms) as url:
        table = trace(int(rate * args.seconds), rate=rate, seed=int(rate))
        summary, rows = run(table, url, results, f"open-{rate:g}")
        fig = client_figures(rows, server_records(url), summary["client"]["t0_clock_s"])

    def show(d: dict) -> str:
        return "  ".join(f"{k} {v:.3f}" for k, v in d.items())
    print(f"open loop {rate:g} req/s for {args.seconds:g} s ({fig['requests']} requests, statuses "
          f"{summary['statuses']}):")
    print(f"  achieved send rate {fig['send_rate_rps']:.2f}/s vs trace {fig['trace_rate_rps']:.2f}/s "
          f"({100 * (fig['send_rate_rps'] / fig['trace_rate_rps'] - 1):+.3f}%)")
    print(f"  send lateness ms:   {show(fig['send_lateness_ms'])}")
    print(f"  TTFT inflation ms:  {show(fig['ttft_inflation_ms'])}   (client first token - server write)")
    print(f"  client CPU {summary['client']['cpu_ms_per_request'] * 1e3:.0f} us/request; "
          f"dispatch lag p99 {summary['client']['dispatch_lag_ms']['p99']} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="duration of each open-loop run")
    ap.add_argument("--rates", type=float, nargs="+", default=[500.0, 1000.0])
    ap.add_argument("--itl-ms", type=float, default=2.0, help="server's gap between tokens in open-loop runs")
    ap.add_argument("--capacity-requests", type=int, default=20000)
    ap.add_argument("--capacity-offered", type=float, default=20000.0,
                    help="offered rate of the capacity run (above what one client core completes)")
    ap.add_argument("--workers", type=int, nargs="*", default=[],
                    help="also measure capacity with these numbers of client processes (e.g. 1 2)")
    ap.add_argument("--no-open-loop", action="store_true", help="only the capacity runs")
    ap.add_argument("--profile", action="store_true",
                    help="first profile the capacity run (cProfile) and print where the time per request goes")
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--server-cpu", type=int, default=1)
    args = ap.parse_args()
    probe, loop = new_event_loop()  # what the replayer will run on (LLMLB_EVENT_LOOP=asyncio to compare)
    probe.close()
    print(f"client on CPU {args.client_cpu}, server on CPU {args.server_cpu}, event loop {loop}, "
          f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M')}")
    machine_noise(args.client_cpu)
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp)
        if 1 not in args.workers:  # else measured below
            capacity(args, results)
        if not args.no_open_loop:
            for rate in args.rates:
                open_loop(args, results, rate)
        scaling = {}
        for n in args.workers:
            # one process per core: a single worker on the client core, more on all of them
            os.sched_setaffinity(0, {args.client_cpu} if n == 1 else set(range(os.cpu_count() or 1)))
            scaling[n] = capacity(args, results, n)
        if len(scaling) > 1 and 1 in scaling:
            print("worker scaling: " + ", ".join(f"{n} -> {v / scaling[1]:.2f}x" for n, v in scaling.items()))


if __name__ == "__main__":
    main()
