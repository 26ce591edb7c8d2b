"""The report against the run it reports on: a simulated run of N requests, then its report, repeated.

    python benchmarks/report_speed.py                 # 100k chat requests on 4 replicas, 3 repeats
    python benchmarks/report_speed.py --requests 20000 --repeats 5

Prints, per repeat, the simulation's wall and CPU time, the report's (catalog, every
figure, verdict-free single run, terminal rendering into a buffer) and their
ratio — the end-of-run report's share of the run — then the median and range,
the peak resident memory of the process and the load average (the machine is
shared: compare figures taken at a similar load). Aims (issue 14): the report
of a 100k-request run within 1 s, and never more than 20% of the run's time.
On a loaded machine the CPU ratio is the one to read: the wall times then
measure mostly the wait for a core. To compare two versions of the package
side by side, run this file alternately with PYTHONPATH set to each checkout.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import tempfile
import time
from pathlib import Path

from rich.console import Console

from llmlb_bench.experiment import simulate_run
from llmlb_bench.report import terminal
from llmlb_bench.report.document import ReportOptions, build
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.schema import read_trace, write_trace
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.store.views import Catalog
from llmlb_bench.workload import generate, load_spec

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    spec = load_spec(REPO / "workloads" / "chat.toml")
    spec = spec.replace(seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        table = generate(spec.replace(requests=args.requests))   # the chat mix, more of it
        write_trace(table, root / "t.parquet", spec=spec.to_dict(), block_size=spec.block_size)
        table = read_trace(root / "t.parquet")
        sims, reports, sims_cpu, reports_cpu = [], [], [], []
        for i in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            store = simulate_run(table, root / "t.parquet", ClusterConfig.build(replicas=4), "least_outstanding", {}, 1,
                                 root / "r", run_id=f"run{i}")
            sims.append(time.perf_counter() - t0)
            sims_cpu.append(time.process_time() - c0)
            t0, c0 = time.perf_counter(), time.process_time()
            doc = build(Catalog([store.dir]), ReportOptions(slo=Slo.parse("ttft=500ms,tpot=50ms")))
            terminal.render(doc, Console(file=io.StringIO(), width=120))
            reports.append(time.perf_counter() - t0)
            reports_cpu.append(time.process_time() - c0)
            print(f"repeat {i + 1}: simulate {sims[-1]:.2f} s (CPU {sims_cpu[-1]:.3f} s), report {reports[-1]:.2f} s "
                  f"(CPU {reports_cpu[-1]:.3f} s): {100 * reports[-1] / sims[-1]:.0f}% of the run "
                  f"({100 * reports_cpu[-1] / sims_cpu[-1]:.1f}% in CPU time); load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    ratios = [r / s for r, s in zip(reports, sims)]
    cpu_ratios = [r / s for r, s in zip(reports_cpu, sims_cpu)]
    print(f"{args.requests:,} requests: simulate median {med(sims):.2f} s [{min(sims):.2f}-{max(sims):.2f}], "
          f"report median {med(reports):.2f} s [{min(reports):.2f}-{max(reports):.2f}], report/run "
          f"{100 * med(ratios):.0f}% [{100 * min(ratios):.0f}-{100 * max(ratios):.0f}%], in CPU time "
          f"{100 * med(cpu_ratios):.0f}% [{100 * min(cpu_ratios):.0f}-{100 * max(cpu_ratios):.0f}%]; peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
