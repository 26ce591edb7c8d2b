"""llmlb route beside vllm-router, sglang-router and smg: CPU per request, added latency, capacity.

Setup (one run, side by side): two no-op streaming servers (llmlb_bench.replay.noop_server, every
request 8 one-token chunks, no delays) pinned to core 0 with the client (llmlb's replayer, in this
process); the router under test pinned alone to core 1 (``taskset -c 1``), round robin over the two
servers. For each repeat and each router, in turn:

* open loop at each rate (default 200 and 1,000 requests/s, 4 s): TTFT and E2E p50/p99 from the
  client's schedule, minus those of the ``direct`` run (the replayer routing round robin itself,
  same rate, same servers): the latency the router adds;
* the router's CPU (user + system, from /proc, all threads) over the open-loop run, per request;
* capacity: closed loop, 128 users without think time, 6,000 requests; completed requests per second
  of the span (the router, alone on its core, is meant to be the bottleneck).

Figures are medians over repeats with [min, max]; ratios are against vllm-router. The machine's
load average is printed, since on a shared 2-core machine it decides the p99s. Run under the
measurement lock:

    flock /tmp/llmlb-measure.lock python benchmarks/router_vs_peers.py [--rates 200 1000] [--seconds 4]
        [--repeat 3] [--routers llmlb-route vllm-router sglang-router smg] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, replay
from llmlb_bench.replay.selfcheck import noop_server
from llmlb_bench.pypi_routers.launch import LLMLB_ROUTE, RouterProcess
from llmlb_bench.schema import trace_table
from llmlb_bench.store import RunStore

ROUTERS = [LLMLB_ROUTE, "vllm-router", "sglang-router", "smg"]


def run_load(endpoints: list[str], rate: float | None, n: int, out: Path, name: str) -> dict[str, Any]:
    """Open loop at ``rate`` (or closed loop with 128 users when None); latency figures in ms."""
    arrival = np.arange(n) / rate if rate else np.zeros(n)
    trace = trace_table(arrival, 64, 8, "bench")
    opts = ReplayOptions(model="noop", scrape_s=None, users=None if rate else 128, start_delay_s=0.3)
    with RunStore(out, config={}, backend="replay", run_id=name) as run:
        summary = replay(trace, endpoints, make_policy("round_robin"), run, opts)
    t = pq.read_table(run.dir / "requests.parquet").to_pydict()
    ok = np.array([s == "ok" for s in t["status"]])
    sched, first, last = (np.array([np.nan if v is None else v for v in t[k]], float)
                          for k in ("scheduled_s", "first_token_s", "last_token_s"))
    ttft, e2e = (first - sched)[ok] * 1e3, (last - sched)[ok] * 1e3
    sent = np.array([v for v in t["sent_s"] if v is not None])
    return {"ok": int(ok.sum()), "requests": n,
            "ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
            "e2e_p50": float(np.percentile(e2e, 50)), "e2e_p99": float(np.percentile(e2e, 99)),
            "rps": float(ok.sum() / (np.nanmax(last) - sent.min())) if ok.any() else 0.0,
            "lag_p99_ms": summary.get("client", {}).get("lateness_ms", {}).get("p99")}


def spread(values: list[float]) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    return f"{np.median(v):.3g} [{min(v):.3g}, {max(v):.3g}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=float, nargs="+", default=[200.0, 1000.0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--routers", nargs="+", default=ROUTERS)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    os.sched_setaffinity(0, {0})
    load = os.getloadavg()
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        backends = [stack.enter_context(noop_server(cpu=0)) for _ in range(2)]
        for rep in range(args.repeat):
            for rate in args.rates:
                n = int(rate * args.seconds)
                cells.append({"router": "direct", "rate": rate, "repeat": rep,
                              **run_load(backends, rate, n, work, f"d{rep}-{rate:g}")})
            for name in args.routers:
                with RouterProcess(name, "round_robin", backends, work / f"{name}-{rep}.log", cpus="1") as router:
                    for rate in args.rates:
                        n = int(rate * args.seconds)
                        cpu0 = router.cpu_s()
                        fig = run_load([router.url], rate, n, work, f"{name}{rep}-{rate:g}")
                        fig["cpu_ms_per_request"] = (router.cpu_s() - cpu0) * 1e3 / n
                        cells.append({"router": name, "rate": rate, "repeat": rep, **fig})
                    cap = run_load([router.url], None, 6000, work, f"{name}{rep}-cap")
                    cells.append({"router": name, "rate": None, "repeat": rep, **cap})
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; after: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    direct = {(c["rate"], c["repeat"]): c for c in cells if c["router"] == "direct"}
    rows: dict[str, dict[str, list[float]]] = {}
    for c in cells:
        if c["router"] == "direct":
            continue
        r = rows.setdefault(c["router"], {})
        if c["rate"] is None:
            r.setdefault("max_rps", []).append(c["rps"])
            continue
        d = direct[(c["rate"], c["repeat"])]
        for k in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99"):
            r.setdefault(f"added_{k}@{c['rate']:g}", []).append(c[k] - d[k])
        r.setdefault(f"cpu_ms@{c['rate']:g}", []).append(c["cpu_ms_per_request"])
        r.setdefault(f"errors@{c['rate']:g}", []).append(c["requests"] - c["ok"])
    keys = sorted({k for r in rows.values() for k in r})
    print("| router | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(spread(r.get(k, [])) for k in keys) + " |")
    ref = rows.get("vllm-router")
    if ref:
        print("\nratios to vllm-router (medians):")
        for name, r in rows.items():
            parts = [f"{k} {np.median(r[k]) / np.median(ref[k]):.2f}x" for k in keys
                     if k.startswith(("cpu_ms", "max_rps")) and r.get(k) and ref.get(k) and np.median(ref[k])]
            print(f"  {name}: " + ", ".join(parts))
    if args.out:
        args.out.write_text(json.dumps({"load": load, "cells": cells}, indent=1) + "\n")


if __name__ == "__main__":
    main()
