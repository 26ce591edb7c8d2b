"""How long ``llmlb report`` takes over ten million request rows.

Writes synthetic runs through the real store (``RunStore`` and its Parquet
sink, in row groups, as a backend would), then times the report: the
summary of every run (all metrics of docs/metrics.md, with bootstrap
intervals), the terminal and JSON renderings, and optionally the HTML with
its figures. Rows look like a simulated run's: Poisson arrivals, two
tenants and two SLO classes, lognormal TTFT and per-token gaps, two or
three token-time segments per request (prefill chunk, decode runs), and a
per-replica series with power.

    python benchmarks/report_10m.py                  # 2 runs x 5M rows
    python benchmarks/report_10m.py --rows 1000000 --runs 4 --html

Prints the time of each step and the rows per second of the report, the
CPU time the report used (all threads) and the peak resident memory: on a
shared machine the load average, printed too, moves the wall time, much
less the CPU time. Run it with ``--keep`` on a folder already written to
time the report alone (its peak memory then is the report's); to compare
two versions side by side, run it alternately with PYTHONPATH set to each
checkout.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from rich.console import Console

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options
from llmlb_bench.report import terminal
from llmlb_bench.report.document import ReportOptions, build, to_json
from llmlb_bench.schema import TOKEN_SEGMENT
from llmlb_bench.store import RunStore
from llmlb_bench.store.views import Catalog

BATCH = 1 << 20
REPLICAS = 8


def token_times(first: np.ndarray, gap: np.ndarray, out: np.ndarray,
                rng: np.random.Generator) -> tuple[pa.Array, np.ndarray]:
    """Two segments per request (the first token, then the decode run), a third after a stall for 20%.

    Returns the segments and each request's last token time.
    """
    n = len(first)
    stall = rng.random(n) < 0.2
    k = np.maximum(out - 1, 1)
    split = np.where(stall, np.maximum(k // 2, 1), k)
    nseg = 2 + stall.astype(np.int64)
    offsets = np.r_[0, np.cumsum(nseg)].astype(np.int32)
    idx = offsets[:-1]
    start = np.empty(offsets[-1])
    gaps = np.empty(offsets[-1])
    count = np.empty(offsets[-1], dtype=np.int32)
    start[idx], gaps[idx], count[idx] = first, 0.0, 1
    start[idx + 1], gaps[idx + 1], count[idx + 1] = first + gap, gap, split
    s3 = idx[stall] + 2
    resume = first[stall] + gap[stall] * (split[stall] + 1) + rng.exponential(0.2, stall.sum())
    start[s3], gaps[s3], count[s3] = resume, gap[stall], (k - split)[stall]
    seg = pa.StructArray.from_arrays([pa.array(start), pa.array(gaps), pa.array(count)],
                                     fields=list(TOKEN_SEGMENT))
    last = first + gap * k
    last[stall] = resume + gap[stall] * ((k - split)[stall] - 1)
    return pa.ListArray.from_arrays(pa.array(offsets), seg), last


def write_run(results: Path, run_id: str, rows: int, seed: int, rate: float) -> None:
    rng = np.random.default_rng(seed)
    config = {"offered_rate": rate, "policy": {"name": run_id},
              "cluster": {"pools": [{"name": "default", "replicas": REPLICAS, "tp": 1, "gpu": "h100-sxm"}]}}
    t = 0.0
    with RunStore(results, config=config, backend="sim", label=run_id, run_id=run_id) as run:
        for a in range(0, rows, BATCH):
            n = min(BATCH, rows - a)
            sent = t + np.cumsum(rng.exponential(1 / rate, n))
            t = float(sent[-1])
            ttft = rng.lognormal(np.log(0.08), 0.7, n)
            gap = rng.lognormal(np.log(0.02), 0.3, n)
            out = np.minimum(rng.lognormal(np.log(150), 0.8, n).astype(np.int64) + 1, 4096)
            first = sent + ttft
            tt, last = token_times(first, gap, out, rng)
            run.requests.write({
                "request_id": np.arange(a, a + n), "tenant": np.where(rng.random(n) < 0.7, "chat", "batch"),
                "slo_class": np.where(rng.random(n) < 0.8, "interactive", "batch"),
                "target": np.char.add("r", (np.arange(a, a + n) % REPLICAS).astype(str)),
                "scheduled_s": sent, "sent_s": sent, "first_token_s": first, "last_token_s": last,
                "token_times": tt, "input_tokens": rng.lognormal(np.log(400), 1.0, n).astype(np.int32) + 1,
                "output_tokens": out.astype(np.int32), "cached_tokens": rng.integers(0, 200, n, dtype=np.int32),
                "status": np.where(rng.random(n) < 0.002, "error", "ok"), "preemptions": rng.poisson(0.01, n),
                "energy_j": gap * out * 300.0})
        ticks = np.arange(0.0, t, 1.0)
        m = len(ticks)
        run.series.write({"t_s": np.repeat(ticks, REPLICAS), "target": np.tile([f"r{i}" for i in range(REPLICAS)], m),
                          "waiting": rng.poisson(2, m * REPLICAS), "running": rng.poisson(60, m * REPLICAS),
                          "kv_blocks_used": rng.integers(0, 30000, m * REPLICAS),
                          "kv_blocks_total": np.full(m * REPLICAS, 30000), "power_w": rng.uniform(300, 700, m * REPLICAS)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=5_000_000, help="request rows per run")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--html", action="store_true", help="also render the HTML report with figures (needs matplotlib)")
    ap.add_argument("--keep", type=Path,
                    help="write the runs here and keep them, or reuse the runs already there (default: a temporary folder)")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="llmlb-10m-"))
    try:
        total = args.rows * args.runs
        if not (root / "policy0" / "run.json").is_file():
            t0 = time.perf_counter()
            for i in range(args.runs):
                write_run(root, f"policy{i}", args.rows, seed=i, rate=2000.0)
            print(f"wrote {total:,} request rows in {args.runs} runs through the sink: {time.perf_counter() - t0:.1f} s")
        print(f"load average before the report: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        opts = ReportOptions(slo=Slo.parse("ttft=200ms,tpot=30ms;batch:e2e=30s"), summary=Options())
        t0, c0 = time.perf_counter(), time.process_time()
        cat = Catalog([root])
        doc = build(cat, opts)
        t_build, c_build = time.perf_counter() - t0, time.process_time() - c0
        t0 = time.perf_counter()
        terminal.render(doc, Console(file=io.StringIO(), width=160))
        text = to_json(doc)
        t_render = time.perf_counter() - t0
        rows = sum(r["requests"] for r in doc["runs"])
        print(f"report over {rows:,} rows: summary {t_build:.1f} s wall ({c_build:.1f} CPU-seconds, all threads), "
              f"terminal + JSON {t_render:.2f} s ({rows / (t_build + t_render):,.0f} rows/s); JSON {len(text):,} bytes; "
              f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB (the writing included "
              f"when it ran here); load average after {os.getloadavg()[0]:.1f}")
        if args.html:
            from llmlb_bench.report import figures, html
            from llmlb_bench.report.figdata import figure_data

            t0 = time.perf_counter()
            drawn = build(cat, ReportOptions(slo=opts.slo, summary=Options(cdf=True)))
            page = html.render(drawn, figures.render(drawn, figure_data(cat, drawn)))
            print(f"HTML with figures (summary with CDFs included): {time.perf_counter() - t0:.1f} s "
                  f"({len(page):,} bytes)")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
