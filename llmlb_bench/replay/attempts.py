"""One request's attempts: a connection (pooled, or new), the send, its timeouts and its retries.

An :class:`Attempts` is the owner every :class:`~llmlb_bench.replay.flight.Flight` reports to
(:class:`~llmlb_bench.replay.flight.Outcomes`): it decides whether a failure is retried (the
HTTP statuses of ``RETRY_STATUSES`` and connection failures before any response byte, up to
``ReplayOptions.retries`` further attempts, with a doubling backoff that a larger ``Retry-After``
overrides; a pooled connection the server had already closed is resent once on a new one, free
of charge) and hands each request's final outcome to the run (``ended``), which writes the row.

Timeouts (``ReplayOptions.timeouts``) count from each attempt's start: the total, the first token,
and the gap between tokens once the first one came; one timer per request, armed for the earliest.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Callable

from llmlb_bench.replay.flight import Flight
from llmlb_bench.replay.http import Connection, Pool
from llmlb_bench.replay.options import RETRY_STATUSES, ReplayOptions
from llmlb_bench.replay.probes import Health

_INF = float("inf")

#: the run's part once a request's outcome is known: ``(flight, status, error, now)``
Ended = Callable[[Flight, str, str | None, float], None]


class Attempts:
    """The attempts of every request of one run, over one pool per endpoint (``health`` marks an
    endpoint down when a connection to it fails). ``loop`` is the run's event loop, set before the
    first request leaves."""

    def __init__(self, pools: list[Pool], health: Health, options: ReplayOptions, ended: Ended) -> None:
        self.pools = pools
        self.health = health
        self.options = options
        self.ended = ended
        self.loop: asyncio.AbstractEventLoop | None = None
        #: connections being opened for an attempt (cancelled when the run stops)
        self.connects: set[asyncio.Task[None]] = set()
        #: requests sent (first attempts), and ``perf_counter()`` at the first and the last send
        self.sent = 0
        self.first_sent_at: float | None = None
        self.last_sent_at: float | None = None

    def attempt(self, f: Flight, fresh: bool = False) -> None:
        """Send ``f`` on an idle pooled connection, or open one (always a new one when ``fresh``)."""
        f.timer = None
        if f.done:
            return
        f.attempts += 1
        pool = self.pools[f.target]
        conn = None if fresh else pool.take_idle()
        if conn is not None:
            self._send(f, conn)
            return
        assert self.loop is not None
        task = self.loop.create_task(self._connect(f, pool))
        self.connects.add(task)
        task.add_done_callback(self.connects.discard)

    def cancel_connects(self) -> None:
        for task in list(self.connects):
            task.cancel()

    async def _connect(self, f: Flight, pool: Pool) -> None:
        try:
            conn = await pool.connect()
        except asyncio.TimeoutError:
            self._attempt_failed(f, "timeout", f"connect timeout after {pool.connect_timeout:g} s")
        except OSError as exc:
            self.health.down(f.target)
            self._attempt_failed(f, "error", f"connect failed: {exc.strerror or exc}")
        else:
            if f.done:
                pool.release(conn)
            else:
                self._send(f, conn)

    def _send(self, f: Flight, conn: Connection) -> None:
        now = perf_counter()
        if f.sent is None:
            f.sent = now
            self.sent += 1
            if self.first_sent_at is None:
                self.first_sent_at = now
            self.last_sent_at = now
        f.attempt_start = f.last_rx = now
        f.reused = conn.uses > 0
        f.conn = conn
        conn.send(f.request, f)
        self._arm(f, now)

    # -- timeouts --------------------------------------------------------------
    def _deadline(self, f: Flight) -> tuple[float, str]:
        to = self.options.timeouts
        best, why = _INF, ""
        if to.total is not None:
            best, why = f.attempt_start + to.total, f"exceeded the total timeout of {to.total:g} s"
        if f.first is None:
            if to.first_token is not None and f.attempt_start + to.first_token < best:
                best, why = f.attempt_start + to.first_token, f"no first token within {to.first_token:g} s"
        elif to.between_tokens is not None and f.last is not None and f.last + to.between_tokens < best:
            best = f.last + to.between_tokens
            why = f"no token for {to.between_tokens:g} s after token {f.chunks}"
        return best, why

    def _arm(self, f: Flight, now: float) -> None:
        deadline, _ = self._deadline(f)
        if deadline < _INF:
            assert self.loop is not None
            f.timer = self.loop.call_later(max(0.0, deadline - now), self._on_timer, f)

    def first_token(self, f: Flight, now: float) -> None:
        """From now on the between-token deadline applies, which may come before the first-token one."""
        if self.options.timeouts.between_tokens is not None:
            if f.timer is not None:
                f.timer.cancel()
            self._arm(f, now)

    def _on_timer(self, f: Flight) -> None:
        f.timer = None
        if f.done:
            return
        now = perf_counter()
        deadline, why = self._deadline(f)
        if now + 1e-4 >= deadline:
            self.finished(f, "timeout", why, now)
        else:
            self._arm(f, now)

    # -- outcomes (called by flights) ---------------------------------------
    def failed_before_response(self, f: Flight, reason: str, now: float) -> None:
        """The connection died before any response byte."""
        self._attempt_failed(f, "error", reason, allow_fresh=True)

    def refused(self, f: Flight, http_status: int, error: str, retry_after: float | None,
                now: float) -> None:
        """A complete non-2xx response."""
        if http_status in RETRY_STATUSES and f.attempts <= self.options.retries:
            self._retry(f, max(self._backoff(f), retry_after or 0.0), fresh=False)
        else:
            self.finished(f, "rejected" if http_status == 429 else "error", _with_attempts(f, error), now)

    def _attempt_failed(self, f: Flight, status: str, reason: str, allow_fresh: bool = False) -> None:
        if f.done:
            return
        if allow_fresh and f.reused and not f.fresh_used:
            # a pooled connection the server had already closed (llama-server advertises
            # keep-alive, then closes after a stream): resend once on a new connection
            f.fresh_used = True
            f.attempts -= 1
            self._retry(f, 0.0, fresh=True)
        elif f.attempts <= self.options.retries:
            self._retry(f, self._backoff(f), fresh=False)
        else:
            self.finished(f, status, _with_attempts(f, reason), perf_counter())

    def _backoff(self, f: Flight) -> float:
        delay: float = self.options.retry_backoff_s * 2 ** (f.attempts - 1)
        return delay

    def _retry(self, f: Flight, delay: float, fresh: bool) -> None:
        if f.timer is not None:
            f.timer.cancel()
        if f.conn is not None:
            f.conn.abort()
            f.conn = None
        f.reset_attempt()
        if delay > 0:
            assert self.loop is not None
            f.timer = self.loop.call_later(delay, self.attempt, f, fresh)
        else:
            self.attempt(f, fresh)

    def finished(self, f: Flight, status: str, error: str | None, now: float) -> None:
        """The request's outcome is known: stop its timer and connection, then hand it to the run."""
        if f.done:
            return
        f.done = True
        if f.timer is not None:
            f.timer.cancel()
            f.timer = None
        if f.conn is not None:  # an exit that did not hand the connection back
            f.conn.abort()
            f.conn = None
        self.ended(f, status, error, now)


def _with_attempts(f: Flight, error: str) -> str:
    return f"{error} (after {f.attempts} attempts)" if f.attempts > 1 else error
