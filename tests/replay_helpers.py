"""Helpers for the replayer tests: real servers on 127.0.0.1 in a background thread.

The replayer runs its own event loop in the test's thread, so servers get a
loop of their own in a second thread; both talk over real loopback sockets.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web

from llmlb_bench.policies import make_policy
from llmlb_bench.replay import ReplayOptions, preflight, replay
from llmlb_bench.replay.noop_server import NoopConfig, start as start_noop
from llmlb_bench.store import RunStore


class ServerThread:
    """An asyncio loop in a daemon thread that hosts the test's servers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._cleanups: list[Callable[[], Awaitable[Any]]] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        return asyncio.run_coroutine_threadsafe(fn(), self.loop).result(timeout=300)   # a hang's bound

    def noop(self, cfg: NoopConfig | None = None) -> tuple[str, NoopConfig]:
        """A no-op streaming server; returns its URL and config (whose ``records`` fill up)."""
        cfg = cfg or NoopConfig()

        async def go() -> str:
            srv = await start_noop(cfg)
            self._cleanups.append(lambda: _close_server(srv))
            return f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        return self.call(go), cfg

    def aiohttp(self, app: web.Application, port: int = 0) -> str:
        return self.aiohttp_server(app, port)[0]

    def aiohttp_server(self, app: web.Application, port: int = 0) -> tuple[str, web.Server]:
        """An aiohttp app's URL, and its server (whose ``connections`` are those it accepted and holds)."""
        async def go() -> tuple[str, web.Server]:
            runner = web.AppRunner(app, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", port)
            await site.start()
            self._cleanups.append(runner.cleanup)
            assert runner.server is not None
            return f"http://127.0.0.1:{runner.addresses[0][1]}", runner.server
        return self.call(go)

    def close(self) -> None:
        async def go() -> None:
            for fn in reversed(self._cleanups):
                await fn()
        try:
            self.call(go)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)


async def _close_server(srv: asyncio.AbstractServer) -> None:
    srv.close()


@pytest.fixture
def servers():
    st = ServerThread()
    yield st
    st.close()


def run_replay(trace: pa.Table, urls: list[str], results: Path, policy: Any = "round_robin",
               options: ReplayOptions | None = None, run_id: str = "r") -> tuple[dict, list[dict], Path]:
    """Replay in-process; returns the summary, the rows sorted by request id, and the run folder."""
    options = options or ReplayOptions()
    pol = make_policy(policy) if isinstance(policy, str) else policy
    pre = preflight(urls, options)
    with RunStore(results, config={}, backend="replay", run_id=run_id) as run:
        summary = replay(trace, urls, pol, run, options, pre=pre)
    rows = sorted(pq.read_table(run.dir / "requests.parquet").to_pylist(), key=lambda r: r["request_id"])
    return summary, rows, run.dir


def token_count(row: dict) -> int:
    return sum(seg["count"] for seg in row["token_times"] or ())
