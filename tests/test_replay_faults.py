"""Faults: every trace row ends with exactly one result row, whatever a real misbehaving server does.

One aiohttp app on 127.0.0.1 misbehaves according to the path prefix of the
endpoint URL (``http://127.0.0.1:P/<fault>``), so each test points the
replayer at the fault it checks.
"""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from conftest import CTRL_C, make_trace
from replay_helpers import run_replay, servers, token_count  # noqa: F401  (servers is a fixture)

from llmlb_bench.replay import ReplayOptions, Timeouts
from llmlb_bench.replay.selfcheck import noop_server
from llmlb_bench.schema import TRACE, write_trace

TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"t"},"finish_reason":null}]}\n\n'
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
DONE = b"data: [DONE]\n\n"
#: requests the ``gated`` fault holds on their first call (their answer never comes; a resend streams)
GATED = ("2", "3")


def usage(n: int) -> bytes:
    return b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % n


class Faults:
    """The misbehaving server's behaviours and what it saw."""

    def __init__(self) -> None:
        self.calls: dict[str, list[str]] = defaultdict(list)
        self.per_connection: dict[tuple, int] = defaultdict(int)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{fault}/v1/models", self.models)
        app.router.add_post("/{fault}/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        fault = request.match_info["fault"]
        body = await request.json()
        rid = request.headers["X-Request-Id"]
        self.calls[fault].append(rid)
        n = body["max_tokens"]
        conn_key = request.transport.get_extra_info("peername")  # the client's port names the connection
        self.per_connection[conn_key] += 1
        if fault == "429":
            return web.json_response({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "0"})
        if fault == "500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if fault == "flaky503" and self.calls[fault].count(rid) == 1:
            return web.json_response({"detail": "warming up"}, status=503)
        if fault == "html":
            return web.Response(text="<html>maintenance</html>", content_type="text/html")
        if fault == "close_reused" and self.per_connection[conn_key] > 1:
            request.transport.close()  # the server dropped the kept-alive connection under us
            return web.Response()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if fault == "stall_first" or fault == "gated" and rid in GATED and self.calls[fault].count(rid) == 1:
            await asyncio.sleep(30 if fault == "stall_first" else 3600)   # gated: until the client leaves
        for i in range(n):
            if fault == "stall_mid" and i == 2:
                await asyncio.sleep(30)
            if fault == "reset" and i == 3:
                request.transport.abort()
                return resp
            if fault == "malformed" and i == 1:
                await resp.write(b"data: {oops\n\n")
                await asyncio.sleep(30)
            await resp.write(TOKEN)
            if fault in ("slow", "gated"):
                await asyncio.sleep(0.05)
        await resp.write(FINISH + usage(n) + DONE)
        if fault == "close_after":  # llama-server: keep-alive advertised, connection closed anyway
            await resp.write_eof()
            request.transport.close()
        return resp


@pytest.fixture
def faults(servers):  # noqa: F811
    f = Faults()
    base = servers.aiohttp(f.app())
    return f, base


def _replay(base, fault, tmp_path, n=4, rate=100.0, out=5, **opts):
    options = ReplayOptions(**opts)
    return run_replay(make_trace(n=n, rate=rate, output_tokens=out), [f"{base}/{fault}"], tmp_path,
                      options=options)


def test_first_token_timeout(faults, tmp_path):
    f, base = faults
    _, rows, _ = _replay(base, "stall_first", tmp_path, timeouts=Timeouts(first_token=0.3))
    assert [r["status"] for r in rows] == ["timeout"] * 4
    assert all("no first token within 0.3 s" in r["error"] and r["first_token_s"] is None for r in rows)
    assert all(r["output_tokens"] == 0 and r["http_status"] == 200 for r in rows)


def test_between_tokens_timeout_keeps_the_tokens_received(faults, tmp_path):
    f, base = faults
    _, rows, _ = _replay(base, "stall_mid", tmp_path, timeouts=Timeouts(between_tokens=0.3))
    for r in rows:
        assert r["status"] == "timeout" and "no token for 0.3 s after token 2" in r["error"]
        assert r["output_tokens"] == 2 and token_count(r) == 2 and r["output_tokens_estimated"]


def test_total_timeout(faults, tmp_path):
    f, base = faults
    _, rows, _ = _replay(base, "slow", tmp_path, n=2, out=40, timeouts=Timeouts(total=0.4))
    for r in rows:
        assert r["status"] == "timeout" and "total timeout of 0.4 s" in r["error"]
        assert 4 <= r["output_tokens"] <= 10


def test_connect_timeout(tmp_path):
    # a listener that never accepts, with its one-slot backlog taken: new connections hang in SYN
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    filler = socket.create_connection(srv.getsockname())
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    from llmlb_bench.replay.preflight import Preflight
    from llmlb_bench.replay.http import parse_endpoint
    from llmlb_bench.policies import make_policy
    from llmlb_bench.replay import replay
    from llmlb_bench.store import RunStore
    try:
        pre = Preflight([parse_endpoint(url)], ["m"], [True])
        opts = ReplayOptions(timeouts=Timeouts(connect=0.2))
        with RunStore(tmp_path, config={}, backend="replay", run_id="c") as run:
            replay(make_trace(n=3, rate=100.0), [url], make_policy("round_robin"), run, opts, pre=pre)
        rows = pq.read_table(run.dir / "requests.parquet").to_pylist()
    finally:
        filler.close()
        srv.close()
    assert [r["status"] for r in rows] == ["timeout"] * 3
    assert all(r["error"] == "connect timeout after 0.2 s" and r["sent_s"] is None for r in rows)


def test_429_is_rejected_and_5xx_is_an_error_with_the_servers_message(faults, tmp_path):
    f, base = faults
    _, rows, _ = _replay(base, "429", tmp_path / "a")
    assert all(r["status"] == "rejected" and r["http_status"] == 429 and r["error"] == "HTTP 429: slow down"
               for r in rows)
    _, rows, _ = _replay(base, "500", tmp_path / "b")
    assert all(r["status"] == "error" and r["http_status"] == 500 and r["error"] == "HTTP 500: boom" for r in rows)


def test_retry_policy_retries_5xx(faults, tmp_path):
    f, base = faults
    _, rows, _ = _replay(base, "flaky503", tmp_path / "a")
    assert all(r["status"] == "error" and r["error"] == "HTTP 503: warming up" for r in rows)
    f.calls.clear()
    _, rows, _ = _replay(base, "flaky503", tmp_path / "b", retries=2, retry_backoff_s=0.05)
    assert all(r["status"] == "ok" and r["output_tokens"] == 5 for r in rows)
    assert len(f.calls["flaky503"]) == 8  # each request: one 503, then success
    _, rows, _ = _replay(base, "429", tmp_path / "c", retries=1, retry_backoff_s=0.01)
    assert all(r["status"] == "rejected" and "(after 2 attempts)" in r["error"] for r in rows)


def test_connection_reset_mid_stream(faults, tmp_path):
    f, base = faults
    _, rows, _ = _replay(base, "reset", tmp_path)
    for r in rows:
        assert r["status"] == "error" and "(after 3 tokens)" in r["error"]
        assert r["output_tokens"] == 3 and r["first_token_s"] is not None


def test_malformed_stream_and_wrong_content_type(faults, tmp_path):
    f, base = faults
    _, rows, _ = _replay(base, "malformed", tmp_path / "a")
    assert all(r["status"] == "error" and r["error"] == "malformed JSON in stream: {oops" for r in rows)
    assert all(r["output_tokens"] == 1 for r in rows)
    _, rows, _ = _replay(base, "html", tmp_path / "b")
    assert all(r["status"] == "error" and "unexpected content-type 'text/html" in r["error"] for r in rows)


@pytest.mark.parametrize("fault", ["close_after", "close_reused"])
def test_a_server_that_drops_kept_alive_connections_is_survived(faults, tmp_path, fault):
    f, base = faults
    _, rows, _ = _replay(base, fault, tmp_path, n=30, rate=300.0, out=3)
    assert all(r["status"] == "ok" and r["output_tokens"] == 3 for r in rows)
    if fault == "close_reused":  # requests that hit a dropped connection were resent once, fresh
        assert len(f.calls[fault]) > 30


def test_an_endpoint_down_at_start_is_avoided_then_used_once_it_comes_up(faults, servers, tmp_path):  # noqa: F811
    f, base = faults
    reserved = socket.socket()  # bound, not listening: connections are refused
    reserved.bind(("127.0.0.1", 0))
    port = reserved.getsockname()[1]
    down = f"http://127.0.0.1:{port}/ok"
    trace = make_trace(n=90, rate=30.0, output_tokens=2)

    def revive() -> None:
        # once the run is sending (the preflight, which found the endpoint down, is over), not after a
        # fixed 0.5 s: a preflight slower than that found it up (on a loaded machine, on any machine)
        while not f.calls["ok"]:
            time.sleep(0.01)
        reserved.close()
        servers.aiohttp(Faults().app(), port=port)

    threading.Thread(target=revive, daemon=True).start()
    summary, rows, _ = run_replay(trace, [f"{base}/ok", down], tmp_path, "round_robin")
    assert any("is down at start" in note for note in summary["notes"])
    assert all(r["status"] == "ok" for r in rows)
    late = [r for r in rows if r["target"] == down]
    assert late and min(r["sent_s"] for r in late) > 0.5


def gated_trace() -> pa.Table:
    """Two families (one per worker when there are two): root ``k`` (k = 0, 1), then its child ``k + 2``,
    which the ``gated`` server holds on its first call, then 38 children of that one. Nothing after
    the held request can be sent before it ends, so a signal sent once the server holds both lands
    at the same point of the run on any machine: both roots answered, both held ones in flight, the
    other 76 not sent."""
    parent = [None, None, 0, 1] + [2 + k % 2 for k in range(76)]
    return TRACE.conform(pa.table({
        "request_id": pa.array(range(80), pa.int64()), "arrival_s": [0.0, 0.05] + [0.1] * 78,
        "parent_id": pa.array(parent, pa.int64()),
        "after_parent_s": [None, None, 0.0, 0.0] + [0.02 * (k // 2) for k in range(76)],
        "input_tokens": pa.array([100] * 80, pa.int32()), "output_tokens": pa.array([3] * 80, pa.int32())}), "t")


@pytest.mark.slow
@pytest.mark.parametrize("sig, workers", [(signal.SIGTERM, 1), (signal.SIGINT, 1), (signal.SIGTERM, 2)])
def test_interrupt_keeps_a_partial_run_that_resume_completes(faults, tmp_path, sig, workers):
    """Interrupted at a point of the run's own progress (not of this machine's speed: signalled
    after a fixed delay, or once a request had finished, a slow machine could have sent every
    request by the time the signal landed, and a fast one none): the rows say exactly which requests
    were answered, cut off in flight and never sent, and ``--resume`` completes the run."""
    f, base = faults
    trace = tmp_path / "t.parquet"
    write_trace(gated_trace(), trace)
    cmd = [sys.executable, "-m", "llmlb_bench", "replay", str(trace), "-e", f"{base}/gated",
           "--workers", str(workers), "--results", str(tmp_path / "res"), "--run-id", "x", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **CTRL_C)
    run_dir = tmp_path / "res" / "x"
    start = time.monotonic()
    deadline = start + 600    # a hang's bound, not a speed: the loop ends once both held requests arrived
    while not set(GATED) <= set(f.calls["gated"]):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the held requests never reached the server"
        time.sleep(0.02)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=max(120.0, 10 * (time.monotonic() - start)))  # scaled from its start-up
    assert proc.returncode == 130, err
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "partial" and meta["reason"] == "interrupted"
    rows = sorted(pq.read_table(run_dir / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
    assert [r["request_id"] for r in rows] == list(range(80))
    assert [(r["status"], r["error"]) for r in rows[:4]] == [("ok", None)] * 2 + [("error", "interrupted")] * 2
    assert {r["status"] for r in rows[4:]} == {"not_sent"}
    assert sorted(f.calls["gated"]) == ["0", "1", "2", "3"]      # the server saw nothing else
    assert f"--resume {run_dir}" in err

    done = subprocess.run([*cmd[:-5], "--results", str(tmp_path / "res"), "--resume", str(run_dir), "--no-progress"],
                          capture_output=True, text=True, timeout=max(300.0, 10 * (time.monotonic() - start)))
    assert done.returncode == 0, done.stderr
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "complete" and meta["summary"]["replay"]["resumed"]["carried_rows"] > 0
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    assert sorted(r["request_id"] for r in rows) == list(range(80))
    assert {r["status"] for r in rows} == {"ok"} and {r["run_id"] for r in rows} == {"x"}
    assert not any(p.name.endswith("resume-backup") for p in (tmp_path / "res").iterdir())


@pytest.mark.slow
def test_ten_thousand_streams_open_at_once(tmp_path):
    """The issue's scale: 10,000 concurrent streams, each holding a socket, against a server in its own
    process. The replayer lifts its open-file limit; every request ends ok, each stream stays open for
    the server's six seconds, and so at the peak every request sent in the densest six seconds is open.

    Not a timed figure (this test must not flake on a loaded machine): how fast 10,000 sends go out
    depends on the load, so the peak is checked against the send times the run itself recorded; a
    client that capped or serialized its connections spreads its sends over a minute and fails the
    bound on the densest window."""
    n = 10_000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < n + 1_000:
        pytest.skip("the hard open-file limit of this machine is below 11,000")
    trace = make_trace(n, rate=n / 1.0, output_tokens=2)   # all sent within a second or two
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # a common default: both processes must lift it
    try:
        with noop_server(ttft_ms=6000.0) as url:            # each stream open for six seconds
            summary, rows, _ = run_replay(trace, [url], tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert summary["statuses"] == {"ok": n}
    assert all(r["output_tokens"] == 2 for r in rows)
    opened = np.sort([r["sent_s"] for r in rows])
    closed = np.sort([r["last_token_s"] for r in rows])
    open_at_each_send = np.arange(1, n + 1) - np.searchsorted(closed, opened, side="right")
    held = np.array([r["last_token_s"] - r["sent_s"] for r in rows])
    assert held.min() >= 5.9                                # the server's 6 s, less clock granularity
    densest = (np.arange(n) - np.searchsorted(opened, opened - 5.9, side="left") + 1).max()
    assert open_at_each_send.max() >= densest >= n // 2     # all due within a second; 8.6 s run when quiet
