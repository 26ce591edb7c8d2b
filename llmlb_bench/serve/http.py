"""A small HTTP/1.1 server on asyncio protocols, for streaming at exact token times.

Why not aiohttp's server: at every engine step a simulated replica writes one
SSE chunk to each of its streams. Through aiohttp each chunk is an awaited
``StreamResponse.write`` in a task per stream (a task switch per token),
which costs more CPU than everything else the server does per token; here a
chunk is one ``transport.write`` from the engine's timer callback, and a
client's disconnect reaches the engine at once (``connection_lost``).
Measured (``benchmarks/sse_server_compare.py``: 200 streams, a chunk to each
every 10 ms, same loop, three interleaved 5 s rounds, load average 2.3): this
server 5.6-6.7 us of CPU per chunk, an aiohttp ``StreamResponse`` server
10.3-12.7 us, i.e. aiohttp needs 1.81-2.01x the CPU per streamed token.

The framing covers what OpenAI-compatible clients and routers send:
``Content-Length`` request bodies, keep-alive, pipelined requests (answered
in order), ``Expect: 100-continue`` and HTTP/1.0 (streams then end by
closing the connection). Chunked request bodies get 411 (JSON clients send
a length); heads over 64 KiB get 431 and bodies over 64 MiB 413.
"""

from __future__ import annotations

import asyncio
import traceback
from time import perf_counter
from typing import Callable, Iterable

MAX_HEAD = 64 << 10
MAX_BODY = 64 << 20
_REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            411: "Length Required", 413: "Payload Too Large", 429: "Too Many Requests",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


class HttpRequest:
    """A parsed request: method, path (without the query), lower-case headers, body."""

    __slots__ = ("method", "path", "query", "version", "headers", "body", "received")

    def __init__(self, method: str, path: str, query: str, version: str, headers: dict[str, str],
                 body: bytes, received: float) -> None:
        #: ``perf_counter()`` when its last byte was read (before any parsing)
        self.received = received
        self.method = method
        self.path = path
        self.query = query
        self.version = version
        self.headers = headers
        self.body = body


class Exchange:
    """One request and its response. The handler answers with :meth:`reply`, or with
    :meth:`start_stream`, any number of :meth:`send` and one :meth:`end`. If the client goes
    away first, ``on_lost`` (when set) is called once."""

    __slots__ = ("conn", "request", "keep_alive", "chunked", "started", "finished", "lost", "on_lost")

    def __init__(self, conn: "HttpConnection", request: HttpRequest, keep_alive: bool) -> None:
        self.conn = conn
        self.request = request
        self.keep_alive = keep_alive
        self.chunked = request.version == "HTTP/1.1"
        self.started = self.finished = self.lost = False
        self.on_lost: Callable[[], None] | None = None

    def _head(self, status: int, content_type: str, extra: Iterable[tuple[str, str]], length: int | None) -> bytes:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", f"Content-Type: {content_type}"]
        lines += [f"{k}: {v}" for k, v in extra]
        if length is not None:
            lines.append(f"Content-Length: {length}")
        elif self.chunked:
            lines.append("Transfer-Encoding: chunked")
        else:
            self.keep_alive = False     # HTTP/1.0 stream: the end of the body is the end of the connection
        if not self.keep_alive:
            lines.append("Connection: close")
        elif self.request.version == "HTTP/1.0":
            lines.append("Connection: keep-alive")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def reply(self, status: int, body: bytes, content_type: str = "application/json",
              headers: Iterable[tuple[str, str]] = ()) -> None:
        """A whole response."""
        if self.finished or self.started:
            return
        self.finished = True
        self.conn.write(self._head(status, content_type, headers, len(body)) + body)
        self.conn.exchange_done(self)

    def start_stream(self, content_type: str = "text/event-stream",
                     headers: Iterable[tuple[str, str]] = (("Cache-Control", "no-cache"),)) -> None:
        """Send the head of a response whose body follows in pieces."""
        if not self.started and not self.finished:
            self.started = True
            self.conn.write(self._head(200, content_type, headers, None))

    def send(self, data: bytes) -> None:
        """One piece of a streamed body (one HTTP chunk)."""
        if self.finished or not data:
            return
        self.conn.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)

    def end(self, data: bytes = b"") -> None:
        """The last piece of a streamed body."""
        if self.finished:
            return
        self.finished = True
        if self.chunked:
            self.conn.write((b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data)) if data else b"0\r\n\r\n")
        elif data:
            self.conn.write(data)
        self.conn.exchange_done(self)


class HttpConnection(asyncio.Protocol):
    """One client connection; requests are handled one at a time, in order."""

    def __init__(self, handler: Callable[[Exchange], None], connections: set["HttpConnection"]) -> None:
        self.handler = handler
        self.connections = connections
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.current: Exchange | None = None
        self._continued = False   # 100 Continue sent for the request being read
        self._received = 0.0      # perf_counter() of the last read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.connections.discard(self)
        ex, self.current = self.current, None
        if ex is not None and not ex.finished:
            ex.lost = ex.finished = True
            if ex.on_lost is not None:
                ex.on_lost()

    def data_received(self, data: bytes) -> None:
        self._received = perf_counter()
        self.buf += data
        if self.current is None:
            self._next()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def exchange_done(self, ex: Exchange) -> None:
        if self.current is not ex:
            return
        self.current = None
        if not ex.keep_alive:
            self.close()
        elif self.buf:
            # the next pipelined request: later, never inside the engine callback that ended this one
            asyncio.get_running_loop().call_soon(self._next)

    def _fail(self, status: int, message: str) -> None:
        """A request that cannot be read: answer and close the connection."""
        body = ('{"error":{"message":"%s","type":"BadRequestError","code":%d}}' % (message, status)).encode()
        self.write((f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
        self.buf.clear()
        self.close()

    def _next(self) -> None:
        """Parse and hand over buffered requests while no response is in progress."""
        while self.current is None and self.transport is not None:
            buf = self.buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self._fail(431, "request head too large")
                return
            if end > MAX_HEAD:
                self._fail(431, "request head too large")
                return
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
                self._fail(400, "malformed request line")
                return
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    self._fail(400, "malformed header line")
                    return
                headers[name.strip().lower()] = value.strip()
            if "transfer-encoding" in headers:
                self._fail(411, "chunked request bodies are not supported; send Content-Length")
                return
            raw = headers.get("content-length", "0")
            if not raw.isdigit():
                self._fail(400, "bad Content-Length")
                return
            length = int(raw)
            if length > MAX_BODY:
                self._fail(413, "request body too large")
                return
            if len(buf) < end + 4 + length:
                if not self._continued and headers.get("expect", "").lower() == "100-continue":
                    self._continued = True
                    self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            body = bytes(buf[end + 4:end + 4 + length])
            del buf[:end + 4 + length]
            self._continued = False
            method, target, version = parts
            path, _, query = target.partition("?")
            conn_hdr = headers.get("connection", "").lower()
            keep = "close" not in conn_hdr if version == "HTTP/1.1" else "keep-alive" in conn_hdr
            request = HttpRequest(method, path, query, version, headers, body, self._received)
            ex = self.current = Exchange(self, request, keep)
            try:
                self.handler(ex)
            except Exception:      # a bug in the handler: answer 500, keep serving, show the traceback
                traceback.print_exc()
                ex.reply(500, b'{"error":{"message":"internal server error","type":"InternalServerError",'
                              b'"code":500}}')


async def listen(handler: Callable[[Exchange], None], host: str, port: int,
                 connections: set[HttpConnection]) -> asyncio.Server:
    """Serve ``handler`` on ``host:port`` (0: any free port); open connections join ``connections``."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: HttpConnection(handler, connections), host, port, backlog=4096)
