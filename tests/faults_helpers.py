"""A misbehaving OpenAI-compatible server for the replayer's tests, and the interrupt-then-resume
check that the process workers and the Ray actors share.

One aiohttp app on 127.0.0.1 misbehaves according to the path prefix of the
endpoint URL (``http://127.0.0.1:P/<fault>``), so each test points the
replayer at the fault it checks.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from aiohttp import web
from conftest import CTRL_C

from llmlb_bench.schema import TRACE, write_trace

TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"t"},"finish_reason":null}]}\n\n'
FINISH = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
DONE = b"data: [DONE]\n\n"
#: requests the ``gated`` fault holds on their first call (their answer never comes; a resend streams)
GATED = ("2", "3")
#: how long a held stream waits for its client to leave: a hang's bound, not a speed
HANG_S = 600


def usage(n: int) -> bytes:
    return b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % n


class Faults:
    """The misbehaving server's behaviours and what it saw."""

    def __init__(self) -> None:
        self.calls: dict[str, list[str]] = defaultdict(list)
        self.per_connection: dict[tuple, int] = defaultdict(int)
        #: request id -> (perf_counter when the client left a held stream, tokens written by then)
        self.left: dict[str, tuple[float, int]] = {}
        #: the ``held`` fault answers its request 0 once this is set
        self.release = threading.Event()

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
        if fault == "held" and rid == "0":
            while not self.release.is_set():     # the test sets it (its own bound ends the wait)
                await asyncio.sleep(0.01)
        written = [0]
        try:
            return await self.stream(request, fault, rid, body["max_tokens"], written)
        except asyncio.CancelledError:      # the client closed the connection (handler_cancellation)
            self.left[rid] = (time.perf_counter(), written[0])
            raise

    async def stream(self, request: web.Request, fault: str, rid: str, n: int,
                     written: list[int]) -> web.StreamResponse:
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
            await asyncio.sleep(HANG_S)                                 # until the client leaves
        for i in range(HANG_S * 20 if fault == "drip" else n):     # drip: until the client leaves
            if fault == "stall_mid" and i == 2:
                await asyncio.sleep(HANG_S)                             # until the client leaves
            if fault == "reset" and i == 3:
                request.transport.abort()
                return resp
            if fault == "malformed" and i == 1:
                await resp.write(b"data: {oops\n\n")
                await asyncio.sleep(HANG_S)
            await resp.write(TOKEN)
            written[0] += 1
            if fault in ("drip", "gated"):
                await asyncio.sleep(0.05)
        await resp.write(FINISH + usage(n) + DONE)
        if fault == "close_after":  # llama-server: keep-alive advertised, connection closed anyway
            await resp.write_eof()
            request.transport.close()
        return resp


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


def interrupt_then_resume(f: Faults, base: str, tmp_path: Path, sig: int, *args: str) -> tuple[dict, dict]:
    """``llmlb replay`` of :func:`gated_trace` against the ``gated`` fault (``args``: further options),
    interrupted with ``sig`` at a point of the run's own progress (not of this machine's speed:
    signalled after a fixed delay, or once some requests had arrived, a slow machine could have sent
    every request by the time the signal landed, and a fast one none): the rows say exactly which
    requests were answered, cut off in flight and never sent, and ``--resume`` completes the run.
    Returns the partial run's run.json and the completed one's."""
    trace = tmp_path / "t.parquet"
    write_trace(gated_trace(), trace)
    run_dir = tmp_path / "res" / "x"
    cmd = [sys.executable, "-m", "llmlb_bench", "replay", str(trace), "-e", f"{base}/gated",
           "--results", str(tmp_path / "res"), "--no-progress", *args]
    proc = subprocess.Popen([*cmd, "--run-id", "x"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **CTRL_C)
    start = time.monotonic()
    deadline = start + HANG_S   # a hang's bound, not a speed: the loop ends once both held requests arrived
    while not set(GATED) <= set(f.calls["gated"]):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the held requests never reached the server"
        time.sleep(0.02)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=max(120.0, 10 * (time.monotonic() - start)))  # scaled from its start-up
    assert proc.returncode == 130, err
    partial = json.loads((run_dir / "run.json").read_text())
    assert partial["status"] == "partial" and partial["reason"] == "interrupted"
    rows = sorted(pq.read_table(run_dir / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
    assert [r["request_id"] for r in rows] == list(range(80))
    assert [(r["status"], r["error"]) for r in rows[:4]] == [("ok", None)] * 2 + [("error", "interrupted")] * 2
    assert {r["status"] for r in rows[4:]} == {"not_sent"}
    assert sorted(f.calls["gated"]) == ["0", "1", "2", "3"]      # the server saw nothing else
    assert f"--resume {run_dir}" in err

    done = subprocess.run([*cmd, "--resume", str(run_dir)], capture_output=True, text=True,
                          timeout=max(300.0, 10 * (time.monotonic() - start)))
    assert done.returncode == 0, done.stderr
    complete = json.loads((run_dir / "run.json").read_text())
    assert complete["status"] == "complete" and complete["summary"]["replay"]["resumed"]["carried_rows"] > 0
    rows = pq.read_table(run_dir / "requests.parquet").to_pylist()
    assert sorted(r["request_id"] for r in rows) == list(range(80))
    assert {r["status"] for r in rows} == {"ok"} and {r["run_id"] for r in rows} == {"x"}
    assert not any(p.name.endswith("resume-backup") for p in (tmp_path / "res").iterdir())
    return partial, complete
