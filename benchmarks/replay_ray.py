"""How exact is load generation through Ray actors? Clock offsets, and send times on the server's clock.

On one machine every actor shares the system's clocks, so the truth is
known: an actor's wall clock given a skew of S seconds is exactly S ahead,
and the no-op server (in its own process) stamps each request with the
same monotonic clock the parent's timeline is built on. Three figures:

* offset estimates: ``--measurements`` independent estimates (8 pings
  each) of a skewed actor's offset; error against the true skew, and the
  round trip that bounds it;
* open loop at ``--rate`` for ``--seconds``, 2 actors with clocks skewed
  +3.7 s and -1.2 s, against 2 local worker processes on the same trace:
  send lateness and TTFT inflation measured on the server's clock (so any
  error of the clock correction shows up in them), and the server's read
  time minus the merged ``sent_s``;
* capacity (2 actors vs 2 processes): streamed requests/s when more is
  offered than the client can send, and client CPU per request.

    python benchmarks/replay_ray.py [--seconds 10] [--rate 200] [--capacity-requests 10000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_throughput import trace  # noqa: E402

from llmlb_bench.policies import make_policy  # noqa: E402
from llmlb_bench.replay import ReplayOptions, preflight  # noqa: E402
from llmlb_bench.replay.clock import SkewedClock, measure_offset  # noqa: E402
from llmlb_bench.replay.ray_workers import ReplayActor, replay_on_ray  # noqa: E402
from llmlb_bench.replay.selfcheck import client_figures, noop_server, server_records  # noqa: E402
from llmlb_bench.replay.workers import replay_in_workers  # noqa: E402
from llmlb_bench.store import RunStore  # noqa: E402
from llmlb_bench.sweep.executors import RayExecutor  # noqa: E402

SKEWS = (3.7, -1.2)


def offsets(ray, n: int) -> None:
    actor = ray.remote(ReplayActor).options(num_cpus=1, max_concurrency=2).remote(SkewedClock(SKEWS[0]))
    ests = [measure_offset(lambda: ray.get(actor.now.remote())) for _ in range(n)]
    err = np.array([abs(e.offset_s - SKEWS[0]) for e in ests]) * 1e6
    rtt = np.array([e.rtt_s for e in ests]) * 1e6
    inside = sum(abs(e.offset_s - SKEWS[0]) <= e.rtt_s / 2 for e in ests)
    print(f"offset of a local actor skewed {SKEWS[0]:+g} s, {n} estimates of 8 pings: |error| median "
          f"{np.median(err):.0f} us, max {err.max():.0f} us; round trip median {np.median(rtt):.0f} us, "
          f"max {rtt.max():.0f} us; truth within RTT/2 in {inside}/{n}", flush=True)
    ray.kill(actor)


def run(table: pa.Table, url: str, results: Path, name: str, executor: str) -> tuple[dict, pa.Table]:
    options = ReplayOptions(api="chat", workers=2, executor=executor, scrape_s=None)  # type: ignore[arg-type]
    pre = preflight([url], options)
    with RunStore(results, config={}, backend="replay", run_id=name) as store:
        if executor == "ray":
            summary = replay_on_ray(table, pre, make_policy("round_robin"), store, options,
                                    clocks=[SkewedClock(s) for s in SKEWS])
        else:
            summary = replay_in_workers(table, pre, make_policy("round_robin"), store, options)
    return summary, pq.read_table(store.dir / "requests.parquet")


def open_loop(args: argparse.Namespace, results: Path, executor: str) -> None:
    with noop_server(itl_ms=2.0) as url:
        table = trace(int(args.rate * args.seconds), rate=args.rate, seed=1)
        summary, rows = run(table, url, results, f"open-{executor}", executor)
        records = server_records(url)
    t0 = summary["client"]["t0_clock_s"]
    fig = client_figures(rows, records, t0)
    ok = rows.filter(pa.compute.equal(rows.column("status"), "ok")).to_pylist()
    read = np.array([records[str(r["request_id"])][0] - t0 - r["sent_s"] for r in ok]) * 1e3
    lat, infl = fig["send_lateness_ms"], fig["ttft_inflation_ms"]
    print(f"open loop {args.rate:g} req/s, 2 {'actors (clocks skewed +3.7 s, -1.2 s)' if executor == 'ray' else 'processes'}: "
          f"{fig['ok']}/{fig['requests']} ok; send lateness p50/p99/max {lat['p50']}/{lat['p99']}/{lat['max']} ms; "
          f"TTFT inflation p50/p99 {infl['p50']}/{infl['p99']} ms; server read - merged sent_s p50/min/max "
          f"{np.median(read):.3f}/{read.min():.3f}/{read.max():.3f} ms", flush=True)


def capacity(args: argparse.Namespace, results: Path, executor: str) -> None:
    with noop_server(itl_ms=0.0) as url:
        summary, rows = run(trace(args.capacity_requests, rate=args.capacity_requests / 2.0), url, results,
                            f"capacity-{executor}", executor)
    ok = rows.filter(pa.compute.equal(rows.column("status"), "ok"))
    rps = ok.num_rows / (np.max(ok.column("last_token_s")) - np.min(ok.column("sent_s")))
    print(f"capacity, 2 {'actors' if executor == 'ray' else 'processes'}: {ok.num_rows}/{rows.num_rows} ok, "
          f"{rps:,.0f} streamed requests/s; client CPU {summary['client']['cpu_ms_per_request'] * 1e3:.0f} "
          f"us/request; load average {os.getloadavg()[0]:.1f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--measurements", type=int, default=50)
    ap.add_argument("--capacity-requests", type=int, default=10000)
    args = ap.parse_args()
    print(f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M')}; load average {os.getloadavg()[0]:.1f}")
    with RayExecutor(None, workers=2), tempfile.TemporaryDirectory() as tmp:
        import ray

        offsets(ray, args.measurements)
        for executor in ("process", "ray"):
            open_loop(args, Path(tmp), executor)
        for executor in ("process", "ray"):
            capacity(args, Path(tmp), executor)


if __name__ == "__main__":
    main()
