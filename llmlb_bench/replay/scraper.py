"""The replayer's scrape loop: every endpoint's ``/metrics`` every ``scrape_s`` seconds, into the
policies' view and series.parquet. What the metrics mean and how a scrape becomes a series row is
in :mod:`llmlb_bench.replay.scrape`; this module only asks the endpoints, over the run's own pools.

An endpoint that has no ``/metrics``, or publishes none of the known names, is not asked again; one
that does not answer this time is asked again next time.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Literal

from llmlb_bench.policies.base import View
from llmlb_bench.replay.http import Pool, simple_request
from llmlb_bench.replay.scrape import SeriesRows, Signals, parse_metrics, update_view


class Scraper:
    """Scrapes the endpoints of one run (``pools`` and ``names`` in the view's target order).

    ``clock`` reads the run clock (seconds since trace time 0); ``write`` takes each round's
    series rows."""

    def __init__(self, pools: list[Pool], names: list[str], view: View, headers: str,
                 clock: Callable[[], float], write: Callable[[dict[str, list[object]]], None]) -> None:
        self.pools = pools
        self.names = names
        self.view = view
        self.headers = headers
        self.clock = clock
        self.write = write
        #: the endpoints that answered a scrape at least once (run.json's ``scraped``)
        self.scraped: set[str] = set()
        # endpoints still scraped (dropped when one has no known metrics) and their series rows
        self._active = list(range(len(pools)))
        self._series = SeriesRows()

    async def run(self, interval: float) -> None:
        """Scrape every ``interval`` seconds while any endpoint answers with known metrics."""
        while self._active:
            await self.round(interval)
            await asyncio.sleep(interval)

    async def round(self, timeout: float) -> None:
        """Scrape every endpoint still answering once; write the rows."""
        active, series = self._active, self._series
        answers = await asyncio.gather(*(self._scrape(i, timeout) for i in active))
        now = self.clock()
        for i, sig in zip(list(active), answers):
            if sig is False:  # no /metrics, or none of the known names: stop asking
                active.remove(i)
                continue
            if sig is None:  # unreachable this time
                continue
            update_view(self.view, i, sig, now)
            self.scraped.add(self.names[i])
            series.add(now, self.names[i], sig)
        rows = series.take()
        if rows:
            self.write(rows)

    async def _scrape(self, i: int, timeout: float) -> Signals | Literal[False] | None:
        try:
            status, body = await simple_request(self.pools[i], "GET", "/metrics", self.headers, timeout=timeout)
        except (OSError, asyncio.TimeoutError):
            return None
        if status != 200:
            return False
        sig = parse_metrics(body.decode("utf-8", "replace"))
        return sig if sig.known() else False
