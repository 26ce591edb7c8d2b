"""Endpoint health during a replay: an endpoint that refuses connections is marked down in the
policies' view, and brought back once it accepts one again.

With a single endpoint nothing is marked down: there is nowhere else to route, and a policy that
sees no healthy target would refuse every request until the probe came round.
"""

from __future__ import annotations

import asyncio

from llmlb_bench.policies.base import View, put
from llmlb_bench.replay.http import Pool


class Health:
    """The view's ``healthy`` flags of the replayed endpoints, one pool each (same order)."""

    def __init__(self, view: View, pools: list[Pool]) -> None:
        self.view = view
        self.pools = pools

    def down(self, target: int) -> None:
        """A connection to ``target`` failed: route elsewhere until a probe gets through."""
        if len(self.pools) > 1:
            put(self.view, "healthy", target, False)

    async def revive(self, interval: float = 1.0) -> None:
        """Bring endpoints that refused connections back once they accept one (runs until cancelled)."""
        while True:
            await asyncio.sleep(interval)
            for i, pool in enumerate(self.pools):
                if self.view.healthy[i]:
                    continue
                try:
                    conn = await pool.connect()
                except (OSError, asyncio.TimeoutError):
                    continue
                pool.release(conn)
                put(self.view, "healthy", i, True)
