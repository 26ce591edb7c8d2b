"""How much can ``llmlb serve`` stream on one core, and how close to the simulated token times?

``llmlb serve`` runs in its own process pinned to CPU 0: one routed port in
front of 8 simulated H100 replicas of Llama-3-8B at speed 1 (real time), so
the simulated fleet is never the bottleneck. The replayer, doing all of its
real work, runs here pinned to CPU 1 and sends open-loop Poisson traffic:
64-token prompts, 32 streamed output tokens per request (one SSE chunk per
token). For each offered rate it prints

* achieved requests/s and token chunks/s (ok requests, and their tokens,
  per second of the run);
* the server's CPU use over the run (its own user + system time, as a share of
  one core) and per request: one core at 100% serves about 10^6 / (CPU us per
  request) requests/s, the capacity figure that does not depend on how much
  of its core a shared machine leaves the server;
* the server's token lateness (``llmlb:token_lateness_seconds``, p50 and p99
  interpolated in its histogram): how long after a token's simulated time the
  server had written it;
* the TTFT inflation a client sees: mean client TTFT minus the mean TTFT the
  server simulated (``vllm:time_to_first_token_seconds`` sum / count), i.e.
  loopback, both processes' scheduling, and the server's lateness.

    python benchmarks/serve_throughput.py [--seconds 6] [--rates 200,500,1000,1500,2000,3000]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pyarrow.parquet as pq

from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, preflight, replay
from llmlb_bench.schema import TRACE
from llmlb_bench.store import RunStore

OUTPUT_TOKENS = 32
ROOT = Path(__file__).resolve().parents[1]


def trace(rate: float, seconds: float, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    return TRACE.conform(pa.table({
        "request_id": pa.array(np.arange(n), pa.int64()),
        "arrival_s": pa.array(arrivals - arrivals[0]),
        "input_tokens": pa.array(np.full(n, 64), pa.int32()),
        "output_tokens": pa.array(np.full(n, OUTPUT_TOKENS), pa.int32()),
    }), "bench")


def start_server(cpu: int, flags: list[str]) -> tuple[subprocess.Popen, list[str]]:
    """``llmlb serve FLAGS`` pinned to ``cpu``; returns the process and the URLs it announced."""
    ports = int(flags[flags.index("--replicas") + 1]) if "--port-per-replica" in flags else 1
    proc = subprocess.Popen([sys.executable, "-m", "llmlb_bench", "serve", *flags], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if hasattr(os, "sched_setaffinity")
                            else None)
    urls = []
    while len(urls) < ports:
        line = proc.stdout.readline()
        if " http://" not in line:
            proc.kill()
            raise SystemExit(f"llmlb serve did not start: {line!r}")
        urls.append(line.split()[1])
    return proc, urls


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def histogram(metrics: str, name: str) -> tuple[list[float], list[float], float, float]:
    """Bucket bounds, cumulative counts, sum and count of one histogram in Prometheus text."""
    bounds, counts = [], []
    for le, v in re.findall(rf'^{re.escape(name)}_bucket{{.*le="([^"]+)"}} (\S+)$', metrics, re.M):
        bounds.append(float("inf") if le == "+Inf" else float(le))
        counts.append(float(v))
    total = float(re.search(rf"^{re.escape(name)}_sum{{.*}} (\S+)$", metrics, re.M).group(1))
    count = float(re.search(rf"^{re.escape(name)}_count{{.*}} (\S+)$", metrics, re.M).group(1))
    return bounds, counts, total, count


def quantile(bounds: list[float], counts: list[float], q: float) -> float:
    """Prometheus ``histogram_quantile``: linear within the bucket that holds the rank."""
    rank = q * counts[-1]
    lo, prev = 0.0, 0.0
    for b, c in zip(bounds, counts):
        if c >= rank:
            if b == float("inf"):
                return lo
            return lo + (b - lo) * ((rank - prev) / (c - prev) if c > prev else 0.0)
        lo, prev = b, c
    return lo


def one_rate(rate: float, seconds: float, results: Path) -> str:
    proc, (url,) = start_server(0, ["--replicas", "8", "--gpu", "h100-sxm", "--model", "llama-3-8b", "--port", "0",
                                    "--policy", "least_outstanding"])
    try:
        table = trace(rate, seconds)
        options = ReplayOptions(api="completions", scrape_s=None)
        pre = preflight([url], options)
        cpu0 = cpu_seconds(proc.pid)
        wall0 = time.perf_counter()
        with RunStore(results, config={}, backend="replay", run_id=f"rate{rate:g}") as store:
            summary = replay(table, [url], make_policy("round_robin"), store, options, pre=pre)
        wall = time.perf_counter() - wall0
        cpu = cpu_seconds(proc.pid) - cpu0
        metrics = urllib.request.urlopen(url + "/metrics").read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    rows = pq.read_table(store.dir / "requests.parquet")
    ok = {k: np.array(v) for k, v in rows.filter(pa.compute.equal(rows.column("status"), "ok")).select(
        ["sent_s", "first_token_s", "last_token_s", "output_tokens"]).to_pydict().items()}
    n = len(ok["sent_s"])
    span = ok["last_token_s"].max() - ok["sent_s"].min()
    bounds, counts, _, _ = histogram(metrics, "llmlb:token_lateness_seconds")
    _, _, ttft_sum, ttft_n = histogram(metrics, "vllm:time_to_first_token_seconds")
    inflation = (ok["first_token_s"] - ok["sent_s"]).mean() - ttft_sum / ttft_n
    per_request = cpu / rows.num_rows * 1e6
    return (f"| {rate:g} | {n / span:,.0f} | {ok['output_tokens'].sum() / span:,.0f} | {100 * cpu / wall:.0f}% "
            f"| {per_request:.0f} | {1e6 / per_request:,.0f} "
            f"| {quantile(bounds, counts, 0.5) * 1e3:.2f} | {quantile(bounds, counts, 0.99) * 1e3:.2f} "
            f"| {inflation * 1e3:.2f} | {summary['client']['dispatch_lag_ms']['p99']:.1f} | {n}/{rows.num_rows} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="length of each open-loop run")
    ap.add_argument("--rates", default="200,500,1000,1500,2000,3000", help="offered requests/s, comma-separated")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {1})
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| offered req/s | achieved req/s | token chunks/s | server CPU | CPU us/request | req/s per core "
          "| lateness p50 ms | lateness p99 ms | TTFT inflation ms | client lag p99 ms | ok |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for rate in (float(r) for r in args.rates.split(",")):
            print(one_rate(rate, args.seconds, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
