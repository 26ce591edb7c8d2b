"""How much does the client itself add? Measured against a local no-op server whose clock is the truth.

The no-op server (:mod:`llmlb_bench.replay.noop_server`) runs as its own
process and records, per ``X-Request-Id``, when it had read each request and
when it started writing its first token, on the same system-wide monotonic
clock as the replayer. For every request::

    send lateness   = sent_s - scheduled_s
    TTFT inflation  = client's first-token time - server's first write

``llmlb replay --self-check S`` replays the first S seconds of the trace
this way before the real run and stores the figures in run.json
(``summary.client.self_check``); benchmarks/replay_throughput.py uses the
same functions at fixed rates.

What the client cannot see by itself (a server that stops reading) is
witnessed by :mod:`llmlb_bench.replay.witness` during every replay.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from llmlb_bench.replay.options import ReplayOptions
from llmlb_bench.run_summary import ClientFigures, LagFigures, SelfCheck


@contextmanager
def noop_server(cpu: int | None = None, itl_ms: float = 0.0, ttft_ms: float = 0.0) -> Iterator[str]:
    """Run the no-op server in a subprocess (pinned to ``cpu`` if given); yields its URL."""
    cmd = [sys.executable, "-m", "llmlb_bench.replay.noop_server", "--port", "0", "--itl-ms", str(itl_ms),
           "--ttft-ms", str(ttft_ms)]
    if cpu is not None:
        cmd += ["--cpu", str(cpu)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip() if proc.stdout else ""  # "listening on HOST:PORT"
        if not line.startswith("listening on "):
            raise RuntimeError(f"the no-op server did not start: {line!r}")
        yield "http://" + line.rsplit(" ", 1)[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def server_records(url: str) -> dict[str, list[float]]:
    """The no-op server's ``/stats``: request id -> [read, first write, last write, tokens]."""
    with urllib.request.urlopen(f"{url}/stats", timeout=10) as resp:
        records: dict[str, list[float]] = json.loads(resp.read())
        return records


def _pct(values: np.ndarray) -> LagFigures:
    if not values.size:
        return {"p50": None, "p99": None, "max": None}
    return {"p50": round(float(np.percentile(values, 50)), 4), "p99": round(float(np.percentile(values, 99)), 4),
            "max": round(float(values.max()), 4)}


def client_figures(rows: pa.Table, records: dict[str, list[float]], t0: float) -> ClientFigures:
    """Send lateness, TTFT inflation (ms) and achieved send rate of ok rows, against the server's clock."""
    ok = rows.filter(pc.equal(rows.column("status"), "ok"))
    rid = [str(r) for r in ok.column("request_id").to_pylist()]
    sched = np.asarray(ok.column("scheduled_s"), dtype=float)
    sent = np.asarray(ok.column("sent_s"), dtype=float)
    first = np.asarray(ok.column("first_token_s"), dtype=float)
    server_first = np.array([records[r][1] for r in rid], dtype=float) - t0
    span_sched = sched.max() - sched.min() if sched.size > 1 else 0.0
    span_sent = sent.max() - sent.min() if sent.size > 1 else 0.0
    return {
        "requests": int(rows.num_rows), "ok": int(ok.num_rows),
        "trace_rate_rps": round((sched.size - 1) / span_sched, 3) if span_sched else None,
        "send_rate_rps": round((sent.size - 1) / span_sent, 3) if span_sent else None,
        "send_lateness_ms": _pct((sent - sched) * 1e3),
        "ttft_inflation_ms": _pct((first - server_first) * 1e3),
    }


def self_check(trace: pa.Table, options: ReplayOptions, seconds: float, lag_threshold_ms: float) -> SelfCheck:
    """Replay the first ``seconds`` of ``trace`` (as scheduled) against a local no-op server."""
    from llmlb_bench.policies import make_policy
    from llmlb_bench.replay.preflight import preflight
    from llmlb_bench.replay.entry import replay
    from llmlb_bench.store import RunStore

    arrivals = trace.column("arrival_s")
    start = pc.min(arrivals).as_py() or 0.0
    part = trace.filter(pc.less(arrivals, start + seconds / options.time_scale))
    check = ReplayOptions(api=options.api, time_scale=options.time_scale, users=options.users,
                          think_s=options.think_s, scrape_s=None)
    with noop_server() as url, tempfile.TemporaryDirectory() as tmp:
        pre = preflight([url], check)
        with RunStore(Path(tmp), config={}, backend="replay", run_id="self-check") as run:
            summary = replay(part, [url], make_policy("round_robin"), run, check, pre=pre)
        figures = client_figures(pq.read_table(run.dir / "requests.parquet"), server_records(url),
                                 summary["client"]["t0_clock_s"])
    p99 = figures["send_lateness_ms"]["p99"]
    return {**figures, "seconds": seconds, "dispatch_lag_ms": summary["client"]["dispatch_lag_ms"],
            "flagged": p99 is not None and p99 > lag_threshold_ms}
