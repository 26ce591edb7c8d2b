"""``llmlb route`` end to end: streams pass through byte-identical, every request becomes a results
row naming its backend, a refused backend is retried elsewhere (or becomes an error row), and
SIGTERM drains: the stream in flight finishes, the run is complete."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Awaitable, Callable

import pyarrow.parquet as pq
from aiohttp import web

from llmlb_bench.policies import make_policy
from llmlb_bench.proxy import RouteOptions, RouteProxy
from llmlb_bench.pypi_routers.launch import free_ports
from llmlb_bench.serve import ServeOptions
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.store import RunStore
from llmlb_bench.policies.base import fill, put
from tests.conftest import cli
from tests.replay_helpers import ServerThread, run_replay
from tests.serve_helpers import ServeThread, request
from tests.sim_helpers import poisson_trace

ROOT = Path(__file__).resolve().parents[1]

#: a stream as a backend writes it, in uneven pieces (one splits an event in two)
PIECES = [b'data: {"id":"x","choices":[{"index":0,"text":"he"}]}\n\n',
          b'data: {"id":"x","choices":[{"index":0,"te', b'xt":"llo"}]}\n\ndata: {"id":"x","choices":[{"index":0,"text":"!"}]}\n\n',
          b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,'
          b'"prompt_tokens_details":{"cached_tokens":4}}}\n\n', b"data: [DONE]\n\n"]


def backend_app(complete: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.Application:
    """A backend: ``complete`` answers /v1/completions, /health says ok."""
    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/health", health)
    return app


def fixed_stream_app() -> web.Application:
    async def complete(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Request-Id": "echo"})
        await resp.prepare(request)
        for p in PIECES:
            await resp.write(p)
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp
    return backend_app(complete)


def start_proxy(st: ServerThread, backends: list[str], run: RunStore, policy: str = "round_robin") -> RouteProxy:
    async def go() -> RouteProxy:
        return await RouteProxy(backends, make_policy(policy), run, RouteOptions(port=0, scrape_s=0.2)).start()
    return st.call(go)


def rows_of(run_dir: Path) -> list[dict]:
    return sorted(pq.read_table(run_dir / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])


def test_stream_byte_identical_and_recorded(tmp_path: Path):
    st = ServerThread()
    try:
        backend = st.aiohttp(fixed_stream_app())
        with RunStore(tmp_path, config={}, backend="route", run_id="r") as run:
            proxy = start_proxy(st, [backend], run)
            status, headers, body = request(proxy.url, "POST", "/v1/completions",
                                            {"prompt": "a b c d e", "max_tokens": 3, "stream": True})
            st.call(proxy.drain)
        assert status == 200 and body == b"".join(PIECES)
        assert headers["x-llmlb-backend"] == backend and headers["x-request-id"] == "echo"
        [row] = rows_of(run.dir)
        assert (row["status"], row["backend"], row["target"]) == ("ok", backend, backend)
        assert (row["output_tokens"], row["server_input_tokens"], row["cached_tokens"]) == (3, 5, 4)
        assert row["output_tokens_estimated"] is False and row["requested_output_tokens"] == 3
        assert sum(s["count"] for s in row["token_times"]) == 3   # three token events in four reads
        assert row["scheduled_s"] <= row["sent_s"] <= row["first_token_s"] <= row["last_token_s"]
    finally:
        st.close()


def test_refused_backend_is_retried_then_error_rows(tmp_path: Path):
    """Round robin over a dead and a live backend: every request is served (the dead one is tried,
    refused and marked down); with both dead each request is a 502 and an error row."""
    st = ServerThread()
    try:
        live = st.aiohttp(fixed_stream_app())
        dead = f"http://127.0.0.1:{free_ports(1)[0]}"
        with RunStore(tmp_path, config={}, backend="route", run_id="r") as run:
            proxy = start_proxy(st, [dead, live], run)
            put(proxy.view, "healthy", 0, True)  # as if it died after the last health check
            answers = [request(proxy.url, "POST", "/v1/completions", {"prompt": "x", "stream": True})[0]
                       for _ in range(4)]
            st.call(proxy.drain)
        assert answers == [200] * 4
        assert [r["status"] for r in rows_of(run.dir)] == ["ok"] * 4
        assert {r["backend"] for r in rows_of(run.dir)} == {live}
        with RunStore(tmp_path, config={}, backend="route", run_id="dead") as run:
            proxy = start_proxy(st, [dead, f"http://127.0.0.1:{free_ports(1)[0]}"], run)
            fill(proxy.view, "healthy", [True, True])
            answers = [request(proxy.url, "POST", "/v1/completions", {"prompt": "x", "stream": True})[0]
                       for _ in range(2)]
            st.call(proxy.drain)
        assert answers == [502, 502]
        rows = rows_of(run.dir)
        assert [r["status"] for r in rows] == ["error"] * 2
        assert all("backend unreachable" in r["error"] for r in rows)
        assert "(2 attempts)" in rows[0]["error"]   # the second backend was tried; then both are known down
    finally:
        st.close()


def test_replay_through_route_in_front_of_serve(tmp_path: Path, capsys):
    """A replay through llmlb route: both sides write one row per request; the proxy's rows name
    the backend the replayer's rows name (the X-Llmlb-Backend header llmlb serve set)."""
    fleet = ServeThread(ClusterConfig.build(replicas=2), ServeOptions(port_per_replica=0, speed=20.0))
    st = ServerThread()
    try:
        with RunStore(tmp_path / "proxy", config={}, backend="route", run_id="p") as run:
            proxy = start_proxy(st, fleet.urls, run, "least_outstanding")
            from llmlb_bench.replay import ReplayOptions
            _, client_rows, _ = run_replay(poisson_trace(20, 40.0, seed=4, input_mean=60, output_mean=8),
                                           [proxy.url], tmp_path / "client", "round_robin",
                                           ReplayOptions(time_scale=0.2, scrape_s=None, model="llama-3-8b"))
            st.call(proxy.drain)
        rows = rows_of(run.dir)
        assert len(rows) == 20 and all(r["status"] == "ok" for r in rows) and all(r["status"] == "ok" for r in client_rows)
        assert sorted(r["backend"] for r in rows) == sorted(r["backend"] for r in client_rows)
        assert {r["backend"] for r in rows} == set(fleet.urls)
        assert sum(r["output_tokens"] for r in rows) == sum(r["output_tokens"] for r in client_rows)
        series = pq.read_table(run.dir / "series.parquet").to_pylist()
        assert {s["target"] for s in series} <= set(fleet.urls) and series   # backends' /metrics scraped
        code, out, err = cli(["report", str(tmp_path / "proxy"), "--format", "json"], capsys)   # an ordinary run
        assert code == 0, err
        [report] = json.loads(out)["runs"]
        # the proxy is the router: latency counts from arrival, and the wait is the router's own
        assert (report["run_id"], report["requests"], report["ok"]) == ("p", 20, 20)
        assert report["latency_from"] == "arrival" and report["wait"]["kind"] == "router"
    finally:
        st.close()
        fleet.close()


def held_stream_app(release: threading.Event, written: list[int]) -> web.Application:
    """A backend whose stream goes on, a token every 10 ms, until ``release`` is set; ``written``
    gets the number of tokens it wrote."""
    async def complete(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = 0
        while not release.is_set() or n == 0:
            await resp.write(b'data: {"id":"x","choices":[{"index":0,"text":"t"}]}\n\n')
            n += 1
            await asyncio.sleep(0.01)
        await resp.write(b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n'
                         b"data: [DONE]\n\n" % n)
        written.append(n)
        return resp
    return backend_app(complete)


def test_sigterm_drains_stream_in_flight(tmp_path: Path):
    """`llmlb route` as a process: SIGTERM while a stream is in flight; new connections are refused
    while it goes on, it still ends with [DONE], the process exits 0, run.json says complete.

    The backend's stream lasts until the proxy has been seen refusing (not a 200-token stream of
    about 2 s, which a proxy slower than that to act on SIGTERM outlived): what is checked is the
    order of events, on any machine."""
    st = ServerThread()
    release, written = threading.Event(), []
    backend = st.aiohttp(held_stream_app(release, written))
    port = free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-m", "llmlb_bench", "route", "-b", backend, "--port", str(port),
                             "--results", str(tmp_path), "--run-id", "d", "--scrape-interval", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "route http://127.0.0.1:" in proc.stdout.readline()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "a b c", "max_tokens": 10**6,
                                                                 "stream": True}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()     # the stream has started: the request is in flight
        proc.send_signal(signal.SIGTERM)
        # listening stops while the stream goes on (it goes on until released): until refused, or until
        # the proxy has exited without ever refusing; a hang's bound, not a speed
        deadline, refused, draining = time.monotonic() + 600, False, False
        while not refused and proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=10).close()
                time.sleep(0.02)
            except OSError:
                refused, draining = True, proc.poll() is None and not written   # refused while still serving
        release.set()
        status, body = resp.status, resp.read()
        conn.close()
        assert proc.wait(300) == 0      # generous: it returns as soon as the drained proxy exits
        assert refused and draining
        [n] = written
        assert status == 200 and body.endswith(b"data: [DONE]\n\n") and body.count(b'"choices":[{') == n
        meta = json.loads((tmp_path / "d" / "run.json").read_text())
        assert meta["status"] == "complete"
        [row] = rows_of(tmp_path / "d")
        assert row["status"] == "ok" and row["output_tokens"] == n
    finally:
        release.set()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        st.close()
