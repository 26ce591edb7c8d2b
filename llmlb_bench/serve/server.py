"""``llmlb serve``: start the simulated fleet and its HTTP ports, stop them cleanly.

Two shapes: one port per replica (``port_per_replica``: each port is an
independent engine, so a real router or ``llmlb replay`` with several
``--endpoint`` balances across them), or one port in front of every replica
with a routing policy inside (``port``). Ports bind ``127.0.0.1`` unless a
host is given. Use :class:`SimServer` inside a running event loop (tests,
embedding) or :func:`run` for a blocking server that stops on SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from dataclasses import dataclass
from typing import Callable

from llmlb_bench.errors import UserError
from llmlb_bench.eventloop import new_event_loop
from llmlb_bench.gcpause import pause_full_collections
from llmlb_bench.openfiles import raise_open_files_limit
from llmlb_bench.policies import Policy
from llmlb_bench.serve.api import Api
from llmlb_bench.serve.http import HttpConnection, listen
from llmlb_bench.serve.live import LiveFleet
from llmlb_bench.serve.outputs import OutputRule
from llmlb_bench.sim.config import ClusterConfig


@dataclass(frozen=True)
class ServeOptions:
    """Where and how fast to serve."""

    host: str = "127.0.0.1"
    #: one port for all replicas (0: any free port); ignored when ``port_per_replica`` is set
    port: int = 8000
    #: replica ``i`` listens on ``port_per_replica + i`` (0: each on any free port)
    port_per_replica: int | None = None
    #: simulated seconds per wall-clock second
    speed: float = 1.0
    seed: int = 0
    #: mean answer length when neither ignore_eos nor min_tokens fixes it
    mean_output_tokens: float = 256.0
    #: the model name clients send and /v1/models lists (default: the catalog model)
    model_name: str | None = None
    #: LoRA adapters served under their own names besides the base model (vLLM's --lora-modules)
    lora_modules: tuple[str, ...] = ()


class SimServer:
    """The fleet and its listening ports inside the running event loop."""

    def __init__(self, cfg: ClusterConfig, options: ServeOptions, policy: Policy | None = None) -> None:
        if options.port_per_replica is None and policy is None:
            raise UserError("one port in front of several replicas needs a routing policy", "--policy")
        if not options.mean_output_tokens >= 1:
            raise UserError(f"must be >= 1, got {options.mean_output_tokens!r}", "--mean-output-tokens")
        if options.lora_modules and any(p.max_loras == 0 for p in cfg.pools):
            raise UserError("LoRA adapters need adapter slots: set max_loras in the cluster", "--lora-modules")
        self.cfg = cfg
        self.options = options
        self.fleet = LiveFleet(cfg, speed=options.speed, policy=None if options.port_per_replica is not None
                               else policy, seed=options.seed)
        self.model = options.model_name or cfg.model
        self.rule = OutputRule(options.mean_output_tokens, options.seed)
        self.connections: set[HttpConnection] = set()
        self.servers: list[asyncio.Server] = []
        #: ``(name, url)`` of each port: replica names, or ``"router"``
        self.urls: list[tuple[str, str]] = []

    async def start(self) -> "SimServer":
        opt = self.options
        n = len(self.fleet.replicas)
        plan: list[tuple[str, int | None, int]] = (
            [(self.fleet.replicas[i].name, i, opt.port_per_replica + i if opt.port_per_replica else 0)
             for i in range(n)] if opt.port_per_replica is not None else [("router", None, opt.port)])
        try:
            for name, target, port in plan:
                api = Api(self.fleet, target, self.model, self.rule, opt.lora_modules)
                srv = await listen(api, opt.host, port, self.connections)
                self.servers.append(srv)
                host, real = srv.sockets[0].getsockname()[:2]
                shown = f"[{host}]" if ":" in host else host
                self.urls.append((name, f"http://{shown}:{real}"))
        except OSError as exc:
            await self.close()
            raise UserError(f"cannot listen on {opt.host}:{port}: {exc.strerror or exc}",
                            "--port-per-replica" if opt.port_per_replica is not None else "--port") from None
        return self

    async def close(self) -> None:
        """Stop listening, cut every open connection (streams in flight end there), stop the timers."""
        for srv in self.servers:
            srv.close()
        for conn in list(self.connections):
            conn.abort()
        for srv in self.servers:
            await srv.wait_closed()
        self.fleet.close()

    def totals(self) -> dict[str, int]:
        """Requests and tokens served so far (all replicas)."""
        ms = [st.metrics for st in self.fleet.states]
        return {"finished": sum(sum(m.success.values()) for m in ms), "aborted": sum(m.aborted for m in ms),
                "rejected": self.fleet.rejected, "generated_tokens": sum(m.generation_tokens for m in ms)}


def run(cfg: ClusterConfig, options: ServeOptions, policy: Policy | None = None,
        announce: Callable[[str], None] = print) -> dict[str, int]:
    """Serve until SIGINT or SIGTERM; returns the totals. ``announce`` gets one line per port."""
    loop, _ = new_event_loop()
    stop = asyncio.Event()
    raise_open_files_limit()

    async def main() -> dict[str, int]:
        server = await SimServer(cfg, options, policy).start()
        # what exists now (modules, catalogs, the fleet) lives until the end, and what requests leave
        # behind grows: keep the collector's full passes, which stop the loop, away (see gcpause)
        pause_full_collections()
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(s, stop.set)
        for name, url in server.urls:
            announce(f"{name} {url}")
        try:
            await stop.wait()
        finally:
            await server.close()
        return server.totals()

    try:
        return loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
