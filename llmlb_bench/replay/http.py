"""A small HTTP/1.1 client built on asyncio protocols, for timing-exact streaming.

Why not aiohttp's client: the replayer must timestamp every received chunk
the moment the socket becomes readable (``data_received``), start a request
without a task switch when a pooled connection is idle, and stay far below
the per-request CPU cost of a full-featured client (the target is thousands
of streamed requests per second on one core). Response framing covers what
OpenAI-compatible servers send: ``Content-Length``, ``chunked`` and
read-until-close bodies, keep-alive and ``Connection: close``, over TCP or
TLS. Redirects, proxies and HTTP/2 are out of scope.

A :class:`Connection` carries one exchange at a time and reports it to a
handler object with four callbacks (see :class:`Handler`).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from time import perf_counter
from typing import Protocol
from urllib.parse import urlsplit

from llmlb_bench.errors import UserError

_MAX_HEAD = 65536

# body framings
_NONE, _LENGTH, _CHUNKED, _UNTIL_CLOSE = 0, 1, 2, 3
# chunked-decoder states
_SIZE, _DATA, _DATA_END, _TRAILER = 0, 1, 2, 3


class Handler(Protocol):
    """Receives one HTTP exchange from a :class:`Connection`; ``now`` is ``perf_counter()``."""

    def on_head(self, status: int, headers: dict[str, str], now: float) -> None: ...

    def on_body(self, data: bytes, now: float) -> None: ...

    def on_end(self, now: float) -> None: ...

    def on_lost(self, reason: str, got_response: bool, now: float) -> None: ...


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible server's base URL, split for building requests.

    ``url`` is the normalised form used as the target name in results
    (``scheme://host:port[/prefix]``, without a trailing ``/v1``).
    """

    url: str
    host: str
    port: int
    tls: bool
    prefix: str

    def host_header(self) -> str:
        default = 443 if self.tls else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


def parse_endpoint(raw: str) -> Endpoint:
    """Parse ``http(s)://host[:port][/prefix][/v1]``; anything else is a UserError."""
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"expected an http:// or https:// URL, got {raw!r}", "--endpoint")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UserError(f"bad port in {raw!r}", "--endpoint") from None
    if parts.query or parts.fragment or parts.username:
        raise UserError(f"an endpoint URL takes no query, fragment or credentials: {raw!r}", "--endpoint")
    prefix = parts.path.rstrip("/")
    if prefix.endswith("/v1"):
        prefix = prefix[:-3]
    host = parts.hostname
    shown_host = f"[{host}]" if ":" in host else host
    return Endpoint(url=f"{parts.scheme}://{shown_host}:{port}{prefix}", host=host, port=port,
                    tls=parts.scheme == "https", prefix=prefix)


def build_request(method: str, ep: Endpoint, path: str, headers: str, body: bytes = b"") -> bytes:
    """Serialise one request; ``headers`` is pre-rendered ``Name: value\\r\\n`` lines."""
    length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
    head = f"{method} {ep.prefix}{path} HTTP/1.1\r\nHost: {ep.host_header()}\r\n{headers}{length}\r\n"
    return head.encode("latin-1") + body


class Connection(asyncio.Protocol):
    """One keep-alive connection: writes a request, parses the response incrementally."""

    def __init__(self, pool: "Pool") -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.handler: Handler | None = None
        self.closed = False
        #: requests started on this connection (a reused one may have been closed by the peer)
        self.uses = 0
        self._draining = False
        self._reset_message()

    def _reset_message(self) -> None:
        self._buf = b""
        self._in_body = False
        self._got_bytes = False
        self._framing = _NONE
        self._remaining = 0
        self._chunk_state = _SIZE
        self._keep_alive = True

    # -- asyncio callbacks -------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        handler, self.handler = self.handler, None
        if handler is None:
            return
        now = perf_counter()
        if self._in_body and self._framing == _UNTIL_CLOSE:
            handler.on_end(now)
            return
        what = "connection reset" if exc is not None else "connection closed by server"
        reason = f"{what}: {exc}" if exc is not None and str(exc) else what
        handler.on_lost(reason, self._got_bytes, now)

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost reports the rest

    def data_received(self, data: bytes) -> None:
        now = perf_counter()
        self._got_bytes = True
        if self.handler is None and not self._draining:
            self.abort()  # bytes nobody asked for: this connection cannot be trusted
            return
        if not self._in_body:
            self._buf += data
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    self._fail(f"response head larger than {_MAX_HEAD} bytes", now)
                return
            head, data = self._buf[:end], self._buf[end + 4:]
            self._buf = b""
            if not self._parse_head(head, now):
                return
            if self._framing == _NONE:
                self._message_done(now)
                return
            if not data:
                return
        if self._framing == _CHUNKED:
            self._feed_chunked(data, now)
        elif self._framing == _LENGTH:
            if len(data) >= self._remaining:
                body, self._remaining = data[:self._remaining], 0
                if body:
                    self._deliver(body, now)
                self._message_done(now)
            else:
                self._remaining -= len(data)
                self._deliver(data, now)
        else:
            self._deliver(data, now)

    # -- parsing -----------------------------------------------------------
    def _parse_head(self, head: bytes, now: float) -> bool:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            self._fail(f"not an HTTP/1.x response: {lines[0][:60]!r}", now)
            return False
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if sep:
                key = name.strip().lower().decode("latin-1")
                val = value.strip().decode("latin-1")
                headers[key] = f"{headers[key]}, {val}" if key in headers else val
        if 100 <= status < 200:  # interim response (100 Continue): the real head follows
            return True
        conn_hdr = headers.get("connection", "").lower()
        self._keep_alive = ("close" not in conn_hdr) if parts[0] == b"HTTP/1.1" else ("keep-alive" in conn_hdr)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing, self._chunk_state = _CHUNKED, _SIZE
        elif "content-length" in headers:
            try:
                self._remaining = int(headers["content-length"])
            except ValueError:
                self._fail(f"bad Content-Length {headers['content-length']!r}", now)
                return False
            self._framing = _LENGTH if self._remaining > 0 else _NONE
        elif status in (204, 304):
            self._framing = _NONE
        else:
            self._framing, self._keep_alive = _UNTIL_CLOSE, False
        self._in_body = True
        if self.handler is not None:
            self.handler.on_head(status, headers, now)
        return not self.closed

    def _feed_chunked(self, data: bytes, now: float) -> None:
        buf = self._buf + data if self._buf else data
        pos, n = 0, len(buf)
        out: list[bytes] = []
        while pos < n:
            state = self._chunk_state
            if state == _DATA:
                take = min(self._remaining, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._chunk_state = _DATA_END
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > 4096:
                    self._fail("malformed chunked encoding (no line end)", now)
                    return
                break
            line = buf[pos:eol]
            pos = eol + 2
            if state == _SIZE:
                try:
                    size = int(line, 16)
                except ValueError:  # a chunk extension (";name=value") or garbage
                    try:
                        size = int(line.split(b";", 1)[0], 16)
                    except ValueError:
                        self._fail(f"malformed chunk size {line[:20]!r}", now)
                        return
                if size == 0:
                    self._chunk_state = _TRAILER
                elif pos + size + 2 <= n and buf[pos + size:pos + size + 2] == b"\r\n":
                    out.append(buf[pos:pos + size])  # the whole chunk is here: take it in one step
                    pos += size + 2
                else:
                    self._remaining, self._chunk_state = size, _DATA
            elif state == _DATA_END:
                if line:
                    self._fail("malformed chunked encoding (data longer than its size)", now)
                    return
                self._chunk_state = _SIZE
            elif not line:  # _TRAILER ends with an empty line
                self._buf = b""
                if out:
                    self._deliver(b"".join(out), now)
                if pos < n:
                    self._keep_alive = False  # pipelined bytes we never asked for
                self._message_done(now)
                return
        self._buf = buf[pos:]
        if out:
            self._deliver(out[0] if len(out) == 1 else b"".join(out), now)

    def _deliver(self, data: bytes, now: float) -> None:
        if self.handler is not None:
            self.handler.on_body(data, now)

    def _message_done(self, now: float) -> None:
        handler, self.handler = self.handler, None
        keep = self._keep_alive
        self._reset_message()
        self._draining = False
        if handler is not None:
            handler.on_end(now)
        if keep and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    def _fail(self, reason: str, now: float) -> None:
        handler, self.handler = self.handler, None
        self.abort()
        if handler is not None:
            handler.on_lost(reason, True, now)

    # -- used by the replayer ----------------------------------------------
    def send(self, request: bytes, handler: Handler) -> None:
        """Start an exchange on this (idle) connection."""
        self.handler = handler
        self.uses += 1
        self._reset_message()
        assert self.transport is not None
        self.transport.write(request)

    def detach(self) -> None:
        """The handler has what it needs: read the rest of the response, then reuse the connection."""
        self.handler = None
        self._draining = True

    def abort(self) -> None:
        """Drop the connection now (timeouts, protocol errors, interrupt)."""
        self.handler = None
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.abort()

    def close(self) -> None:
        self.handler = None
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.close()


class Pool:
    """Keep-alive connections to one endpoint; unbounded, as open-loop load needs.

    With ``spare`` > 0 the pool keeps that many connections idle or being
    opened ahead of need (topped up each time one is taken), so a request
    arriving in a burst above the concurrency seen so far finds a connection
    ready instead of paying the TCP (and TLS) handshake between its scheduled
    and its sent time. A failed spare connect stops the topping up until an
    ordinary connect succeeds again, so an endpoint that is down is not
    hammered by the pool.
    """

    def __init__(self, endpoint: Endpoint, connect_timeout: float | None, spare: int = 0) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.spare = spare
        self._idle: list[Connection] = []
        self._all: set[Connection] = set()
        self._opening: set[asyncio.Task[None]] = set()
        self._spare_failed = False
        self._ssl = ssl.create_default_context() if endpoint.tls else None

    def take_idle(self) -> Connection | None:
        """Most recently used idle connection, or None."""
        idle = self._idle
        conn = None
        while idle:
            c = idle.pop()
            if not c.closed and c.transport is not None and not c.transport.is_closing():
                conn = c
                break
        if self.spare:
            self.top_up()
        return conn

    def top_up(self) -> None:
        """Start opening connections until ``spare`` are idle or on their way."""
        short = self.spare - len(self._idle) - len(self._opening)
        if short <= 0 or self._spare_failed:
            return
        loop = asyncio.get_running_loop()
        for _ in range(short):
            task = loop.create_task(self._open_spare())
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    async def _open_spare(self) -> None:
        try:
            conn = await self.connect()
        except (OSError, asyncio.TimeoutError):
            self._spare_failed = True
            return
        self.release(conn)

    async def connect(self) -> Connection:
        """Open a new connection; raises OSError or asyncio.TimeoutError."""
        loop = asyncio.get_running_loop()
        ep = self.endpoint
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: Connection(self), ep.host, ep.port, ssl=self._ssl),
            self.connect_timeout)
        self._all.add(conn)
        self._spare_failed = False
        return conn

    def release(self, conn: Connection) -> None:
        if not conn.closed:
            self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def close_all(self) -> None:
        for task in list(self._opening):
            task.cancel()
        self._idle.clear()
        for conn in list(self._all):
            conn.abort()


class _Collector:
    """Handler that gathers a whole response into a future."""

    def __init__(self, done: "asyncio.Future[tuple[int, bytes]]") -> None:
        self.done = done
        self.status = 0
        self.parts: list[bytes] = []

    def on_head(self, status: int, headers: dict[str, str], now: float) -> None:
        self.status = status

    def on_body(self, data: bytes, now: float) -> None:
        self.parts.append(data)

    def on_end(self, now: float) -> None:
        if not self.done.done():
            self.done.set_result((self.status, b"".join(self.parts)))

    def on_lost(self, reason: str, got_response: bool, now: float) -> None:
        if not self.done.done():
            self.done.set_exception(_Lost(reason, got_response))


class _Lost(ConnectionError):
    def __init__(self, reason: str, got_response: bool) -> None:
        super().__init__(reason)
        self.got_response = got_response


async def simple_request(pool: Pool, method: str, path: str, headers: str, body: bytes = b"",
                         timeout: float = 10.0) -> tuple[int, bytes]:
    """One non-streamed exchange (model discovery, tokenize, health): ``(status, body)``.

    Like the replayer, it retries once on a fresh connection when a reused
    one turns out to have been closed by the server before answering.
    """
    loop = asyncio.get_running_loop()
    request = build_request(method, pool.endpoint, path, headers, body)
    conn = pool.take_idle()
    retried = False
    while True:
        conn = conn or await pool.connect()
        done: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        conn.send(request, _Collector(done))
        try:
            return await asyncio.wait_for(done, timeout)
        except _Lost as exc:
            if retried or exc.got_response or conn.uses < 2:
                raise
            retried, conn = True, None
        except BaseException:
            conn.abort()
            raise
