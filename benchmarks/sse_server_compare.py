"""Does llmlb serve's own HTTP/1.1 server pay? Server CPU per streamed token chunk, side by side with aiohttp.

The pattern is ``llmlb serve``'s: every ``--gap-ms`` an engine step ends and one
SSE chunk goes to every open stream (each request streams ``--chunks`` chunks,
then ends). Both servers run the same ticker in their own process, on the event loop
``llmlb serve`` uses (uvloop where it has wheels):

* ``own``: llmlb_bench.serve.http, where a chunk is one ``transport.write`` from
  the ticker's callback;
* ``aiohttp``: an aiohttp ``web`` handler per request (``StreamResponse``), the
  ticker waking each stream's task, which awaits ``response.write``.

A client process keeps ``--streams`` keep-alive connections busy (a new request
as soon as one ends) for ``--seconds``. Printed per server and round: chunks
written, the server's own CPU seconds (user + system) and CPU microseconds per
chunk; then the ratio aiohttp / own per round, and its spread.

    python benchmarks/sse_server_compare.py [--streams 200] [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
END = b"data: [DONE]\n\n"


class _Ticker:
    """One engine step every ``gap`` seconds: a chunk to each open stream."""

    def __init__(self, gap: float, chunks: int) -> None:
        self.gap, self.chunks = gap, chunks
        self.streams: dict[object, int] = {}
        self.written = 0

    def start(self, on_chunk, on_end) -> None:
        self.on_chunk, self.on_end = on_chunk, on_end
        asyncio.get_running_loop().call_later(self.gap, self.tick)

    def tick(self) -> None:
        for s, left in list(self.streams.items()):
            self.written += 1
            if left <= 1:
                del self.streams[s]
                self.on_end(s)
            else:
                self.streams[s] = left - 1
                self.on_chunk(s)
        asyncio.get_running_loop().call_later(self.gap, self.tick)


async def _serve_own(port: int, ticker: _Ticker) -> None:
    from llmlb_bench.serve.http import listen

    def handler(ex) -> None:
        ex.start_stream()
        ticker.streams[ex] = ticker.chunks

    ticker.start(lambda ex: ex.send(CHUNK), lambda ex: ex.end(END))
    await listen(handler, "127.0.0.1", port, set())


async def _serve_aiohttp(port: int, ticker: _Ticker) -> None:
    from aiohttp import web

    def wake(item, data: bytes | None) -> None:
        q: asyncio.Queue = item
        q.put_nowait(data)

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        q: asyncio.Queue = asyncio.Queue()
        ticker.streams[q] = ticker.chunks
        while True:
            data = await q.get()
            if data is None:
                await resp.write(END)
                await resp.write_eof()
                return resp
            await resp.write(data)

    ticker.start(lambda q: wake(q, CHUNK), lambda q: wake(q, None))
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()


def server_main(kind: str, port: int, seconds: float, gap: float, chunks: int) -> None:
    async def go() -> None:
        ticker = _Ticker(gap, chunks)
        await (_serve_own if kind == "own" else _serve_aiohttp)(port, ticker)
        print("ready", flush=True)
        await asyncio.sleep(1.0)                 # the client connects and reaches its pace
        t0, w0 = os.times(), ticker.written
        await asyncio.sleep(seconds)
        t1 = os.times()
        print(json.dumps({"chunks": ticker.written - w0,
                          "cpu_s": (t1.user - t0.user) + (t1.system - t0.system)}), flush=True)
        os._exit(0)
    from llmlb_bench.eventloop import new_event_loop

    loop, _ = new_event_loop()       # the loop llmlb serve runs on (uvloop where it has wheels)
    loop.run_until_complete(go())


def client_main(port: int, streams: int, seconds: float) -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def one(deadline: float) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.monotonic() < deadline:
            writer.write(head)
            buf = b""
            while b"\r\n0\r\n\r\n" not in buf:    # both servers stream with chunked framing
                data = await reader.read(65536)
                if not data:
                    return
                buf = buf[-16:] + data
        writer.close()

    async def go() -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(one(deadline) for _ in range(streams)), return_exceptions=True)
    asyncio.run(go())


def one_round(kind: str, args: argparse.Namespace, port: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    server = subprocess.Popen([sys.executable, __file__, "--_server", kind, "--_port", str(port),
                               "--seconds", str(args.seconds), "--gap-ms", str(args.gap_ms),
                               "--chunks", str(args.chunks)], stdout=subprocess.PIPE, text=True, env=env)
    assert server.stdout is not None
    assert server.stdout.readline().strip() == "ready"
    client = subprocess.Popen([sys.executable, __file__, "--_client", "--_port", str(port),
                               "--streams", str(args.streams), "--seconds", str(args.seconds + 2)], env=env)
    out = json.loads(server.stdout.readline())
    server.wait()
    client.kill()
    client.wait()
    return {"server": kind, **out, "cpu_us_per_chunk": round(out["cpu_s"] / max(out["chunks"], 1) * 1e6, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gap-ms", type=float, default=10.0)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--_server")
    ap.add_argument("--_client", action="store_true")
    ap.add_argument("--_port", type=int, default=0)
    args = ap.parse_args()
    if args._server:
        return server_main(args._server, args._port, args.seconds, args.gap_ms / 1000, args.chunks)
    if args._client:
        return client_main(args._port, args.streams, args.seconds)
    ratios = []
    for r in range(args.rounds):
        res = {kind: one_round(kind, args, 18700 + 2 * r + (kind == "aiohttp")) for kind in ("own", "aiohttp")}
        for v in res.values():
            print(json.dumps({"round": r + 1, **v}))
        ratios.append(res["aiohttp"]["cpu_us_per_chunk"] / res["own"]["cpu_us_per_chunk"])
    print(f"aiohttp / own server CPU per chunk: {', '.join(f'{x:.2f}' for x in ratios)} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}); load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
