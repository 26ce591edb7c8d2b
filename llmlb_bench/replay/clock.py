"""How far another machine's clock is from ours, measured over the network (Cristian's method).

Load generators on several machines can only keep one schedule if they
agree on when it starts, and their rows can only be merged if their times
are put on one timeline. Wall clocks of different machines differ by
anything from microseconds (PTP) to seconds (no NTP), so the parent asks
each worker for its clock several times: a reply read at ``t_remote``
between our ``t_send`` and ``t_recv`` says the worker's clock is ahead of
ours by about ``t_remote - (t_send + t_recv) / 2``. The true offset lies
within half the round trip of that estimate whatever the two directions'
delays were, so the sample with the smallest round trip is kept (the one a
busy network or a slow scheduler disturbed least) and its round trip is
recorded as the uncertainty.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

#: round trips per measurement: the first ones to a fresh worker are slow (connections, imports)
PINGS = 8


@dataclass(frozen=True)
class ClockOffset:
    """A worker's clock minus ours, in seconds; the truth lies within ``rtt_s / 2`` of ``offset_s``."""

    offset_s: float
    rtt_s: float

    def describe(self) -> dict[str, float]:
        """As stored in run.json."""
        return {"offset_s": self.offset_s, "rtt_s": self.rtt_s, "uncertainty_s": self.rtt_s / 2}


def measure_offset(read_remote: Callable[[], float], pings: int = PINGS,
                   clock: Callable[[], float] = time.time) -> ClockOffset:
    """Offset of the clock that ``read_remote`` reads (one round trip per call) from ``clock``."""
    best: ClockOffset | None = None
    for _ in range(max(1, pings)):
        t_send = clock()
        t_remote = read_remote()
        t_recv = clock()
        rtt = t_recv - t_send
        if best is None or rtt < best.rtt_s:
            best = ClockOffset(t_remote - (t_send + t_recv) / 2, rtt)
    assert best is not None
    return best


def perf_instant(wall_s: float, clock: Callable[[], float] = time.time) -> float:
    """The ``time.perf_counter()`` reading at which ``clock`` will read (or read) ``wall_s``.

    The replayer times everything with the monotonic ``perf_counter``, which
    has no meaning across machines; this turns an agreed wall-clock instant
    into it, on the machine that calls it.
    """
    return time.perf_counter() + (wall_s - clock())


class SkewedClock:
    """This machine's wall clock ``skew_s`` seconds off, as a machine without time synchronisation
    reads it: on one machine, where the truth is known, it shows whether an offset was measured and
    corrected (the tests, ``benchmarks/replay_ray.py``)."""

    def __init__(self, skew_s: float) -> None:
        self.skew_s = skew_s

    def __call__(self) -> float:
        return time.time() + self.skew_s
