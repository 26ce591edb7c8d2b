"""The server as witness: does each endpoint receive what the client believes it sent?

The client's own figures (:mod:`llmlb_bench.replay.selfcheck`, ``summary.client``) are its own
view: ``sent_s`` is when the bytes were handed to the kernel. A server that
stops accepting connections, or whose process stalls, still lets the kernel
complete handshakes and buffer requests, so the client believes it sent on
time while the server receives nothing, for seconds if need be. The only
witness of that is the server's own count. :class:`ServerWitness` therefore
reads each endpoint's ``/metrics`` during the run, on its own thread and
connection, and after the run :func:`server_check` compares, at every
reading, the requests the server says it has received with those the client
had sent to it before asking: a server that is behind by more than
``lag_s`` flags the run (``summary.client.server_check``). The count comes
from ``llmlb:requests_received_total`` (the no-op server) or, on vLLM and
``llmlb serve``, ``vllm:request_success_total`` + ``vllm:num_requests_running``
+ ``vllm:num_requests_waiting`` (requests finished, running or queued; a
request still being tokenized in vLLM's front end is in none of them, so a
lag below about a second is not read as a fault). Other servers publish no
such count and the check says so (``available: false``). Other clients of the
same server only raise the count: the check can miss a fault then, never
invent one.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from time import perf_counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.replay.scrape import metric_lines
from llmlb_bench.run_summary import EndpointCheck, ServerCheck

#: the no-op server's count of completion requests read
RECEIVED_TOTAL = "llmlb:requests_received_total"
#: vLLM's (and llmlb serve's) requests finished, running and waiting: together, those received
_VLLM_RECEIVED = ("vllm:request_success_total", "vllm:num_requests_running", "vllm:num_requests_waiting")
#: a server this far behind the client's sends flags the run (vLLM counts a request only once
#: its front end has tokenized it)
SERVER_LAG_S = 1.0


def received_count(text: str) -> float | None:
    """The server's count of requests received so far, from its ``/metrics`` text; None when it
    publishes no such count."""
    sums: dict[str, float] = {}
    for name, _, value in metric_lines(text):
        if name == RECEIVED_TOTAL or name in _VLLM_RECEIVED:
            try:
                sums[name] = sums.get(name, 0.0) + float(value)
            except ValueError:
                continue
    if RECEIVED_TOTAL in sums:
        return sums[RECEIVED_TOTAL]
    if _VLLM_RECEIVED[0] in sums:
        return sum(sums.get(n, 0.0) for n in _VLLM_RECEIVED)
    return None


class ServerWitness:
    """Reads every endpoint's received count every ``interval`` s on a thread of its own, from just
    before the run (the baseline) to just after it; each reading keeps when it was asked for.

    Its own keep-alive connection per endpoint, opened at the baseline reading, so that a server
    that stops accepting new connections still answers it (and is seen to be behind). An endpoint
    that answers without a count (no ``/metrics``, no known counter) is not asked again."""

    def __init__(self, urls: list[str], interval: float, timeout: float = 2.0) -> None:
        self.urls = urls
        self.interval = interval
        self.timeout = timeout
        #: per endpoint: (perf_counter when asked, received count or None when unreadable)
        self.readings: list[list[tuple[float, float | None]]] = [[] for _ in urls]
        self._conns: list[http.client.HTTPConnection | None] = [None] * len(urls)
        self._no_count = [False] * len(urls)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="llmlb-server-witness", daemon=True)

    def __enter__(self) -> "ServerWitness":
        self._read_all()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read_all()
        for conn in self._conns:
            if conn is not None:
                conn.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._read_all()

    def _read_all(self) -> None:
        for i in range(len(self.urls)):
            if not self._no_count[i]:
                t = perf_counter()
                self.readings[i].append((t, self._read(i)))

    def _read(self, i: int) -> float | None:
        conn = self._conns[i]
        if conn is None:
            u = urllib.parse.urlsplit(self.urls[i])
            kind = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
            conn = self._conns[i] = kind(u.hostname or "127.0.0.1", u.port, timeout=self.timeout)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()  # reconnects at the next reading
            self._conns[i] = None
            return None
        count = received_count(body.decode("utf-8", "replace")) if resp.status == 200 else None
        self._no_count[i] = count is None
        return count


def server_check(rows: pa.Table, readings: dict[str, list[tuple[float, float | None]]], t0: float,
                 lag_s: float = SERVER_LAG_S) -> ServerCheck:
    """Sent (client) against received (server), per endpoint.

    ``rows``: the run's requests (``target``, ``sent_s`` in trace time); ``readings``: per endpoint
    URL, (clock time asked, received count); ``t0``: the clock at trace time 0. At each reading
    after the first (the baseline), the server has received ``R`` of the requests since the
    baseline; the client had sent ``S`` before it asked. When ``R < S`` the ``R+1``-th send, made
    at ``s``, had not reached the server's count when it was asked at ``t``: the server was at least
    ``t - s`` behind. ``lag_s`` is the largest such figure; ``flagged`` when it exceeds the limit."""
    sent_col = rows.column("sent_s")
    targets = rows.column("target")
    endpoints: dict[str, EndpointCheck] = {}
    worst, available = 0.0, False
    for url, series in readings.items():
        counts = [(t - t0, r) for t, r in series if r is not None]
        if len(counts) < 2:
            endpoints[url] = {"readings": len(series), "unreadable": len(series) - len(counts), "available": False}
            continue
        available = True
        mine = pc.and_(pc.equal(targets, url), pc.is_valid(sent_col))
        sent = np.sort(np.asarray(sent_col.filter(mine), dtype=float))
        base = counts[0][1]
        lag, behind_at = 0.0, None
        for t, r in counts[1:]:
            got = int(r - base)
            before = int(np.searchsorted(sent, t, side="left"))  # sent before the server was asked
            if got < before:
                late = t - float(sent[max(got, 0)])
                if late > lag:
                    lag, behind_at = late, t
        endpoints[url] = {"readings": len(series), "unreadable": len(series) - len(counts), "available": True,
                          "sent": int(sent.size), "received": int(counts[-1][1] - base), "lag_s": round(lag, 3),
                          "behind_at_s": None if behind_at is None else round(behind_at, 3)}
        worst = max(worst, lag)
    return {"lag_limit_s": lag_s, "endpoints": endpoints, "available": available,
            "lag_s": round(worst, 3) if available else None, "flagged": available and worst > lag_s}
