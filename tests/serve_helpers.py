"""Helpers for the ``llmlb serve`` tests: the server on its own event loop in a thread, and a
small blocking HTTP client over real loopback sockets."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from typing import Any, Callable
from urllib.parse import urlsplit

from llmlb_bench.serve import ServeOptions, SimServer
from llmlb_bench.sim import ClusterConfig


class ServeThread:
    """A :class:`SimServer` on an event loop in a daemon thread."""

    def __init__(self, cfg: ClusterConfig, options: ServeOptions, policy: Any = None) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server: SimServer = self.call(lambda: SimServer(cfg, options, policy).start())
        self.urls = [url for _, url in self.server.urls]

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run a coroutine function (or a plain function) on the server's loop; return its result."""
        async def go() -> Any:
            out = fn()
            return await out if asyncio.iscoroutine(out) else out
        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(timeout=300)   # a hang's bound

    def close(self) -> None:
        try:
            self.call(self.server.close)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)


def request(url: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
            timeout: float = 300.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP exchange: ``(status, headers, body)``; a dict body is sent as JSON."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def post_json(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    status, _, raw = request(url, "POST", path, body)
    return status, json.loads(raw)


def sse_events(raw: bytes) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded (``[DONE]`` stays a string)."""
    out = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            payload = block[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def raw_socket(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=300)
    return sock


def read_until(sock: socket.socket, marker: bytes, limit: int = 1 << 22) -> bytes:
    buf = b""
    while marker not in buf:
        data = sock.recv(65536)
        if not data or len(buf) > limit:
            break
        buf += data
    return buf


def route_over_serve(tmp_path: Any, inner: Any, outer: Any, n: int = 6) -> list[dict[str, Any]]:
    """``llmlb serve`` (two replicas: one port routing with ``inner``, or one port each when ``inner``
    is None) behind ``llmlb route`` (routed by ``outer``): ``n`` streamed completions through the proxy,
    each answered 200, then the proxy drained; returns the route run's rows (``tmp_path / "r"``)."""
    import pyarrow.parquet as pq

    from llmlb_bench.proxy import RouteOptions, RouteProxy
    from llmlb_bench.store import RunStore
    from tests.replay_helpers import ServerThread

    options = ServeOptions(port_per_replica=0) if inner is None else ServeOptions(port=0)
    fleet = ServeThread(ClusterConfig.build(replicas=2), options, policy=inner)
    st = ServerThread()
    try:
        with RunStore(tmp_path, config={}, backend="route", run_id="r") as run:
            proxy = st.call(lambda: RouteProxy(fleet.urls, outer, run, RouteOptions(port=0, scrape_s=0.2)).start())
            for _ in range(n):
                status, _, _ = request(proxy.url, "POST", "/v1/completions",
                                       {"prompt": "a b c d e", "max_tokens": 4, "stream": True})
                assert status == 200
            st.call(proxy.drain)
    finally:
        st.close()
        fleet.close()
    return pq.read_table(tmp_path / "r" / "requests.parquet").to_pylist()  # type: ignore[no-any-return]
