"""The client's own figures of a replay (run.json ``summary.client``: how late it sent, what it cost) and its
totals (``summary.replay``).

Kept apart from the replayer so that the several-worker merge (:mod:`llmlb_bench.replay.workers`)
computes the same figures over every worker's rows without importing the replayer's entry point.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

import numpy as np

from llmlb_bench.run_summary import ClientSummary, ReplaySummary

if TYPE_CHECKING:
    from llmlb_bench.replay.preflight import Preflight


class ReplayResult(ReplaySummary):
    """What ``replay()`` returns: the totals of ``summary.replay`` with the client's figures beside them."""

    client: ClientSummary


def client_summary(lateness_s: np.ndarray, cpu_s: float, sent: int, loop_kind: str, t0: float,
                   threshold_ms: float, workers: int = 1) -> ClientSummary:
    """The self-check figures stored as run.json ``summary.client``."""
    lag = lateness_s * 1e3

    def pct(q: float) -> float | None:
        return round(float(np.percentile(lag, q)), 4) if lag.size else None

    p99 = pct(99)
    return {
        "event_loop": loop_kind,
        "workers": workers,
        "clock": "time.perf_counter (CLOCK_MONOTONIC on Linux)",
        "t0_clock_s": t0,
        "dispatch_lag_ms": {"p50": pct(50), "p99": p99, "max": round(float(lag.max()), 4) if lag.size else None},
        "lag_threshold_ms": threshold_ms,
        "flagged": p99 is not None and p99 > threshold_ms,
        "cpu_s": round(cpu_s, 3),
        "cpu_ms_per_request": round(cpu_s * 1e3 / sent, 4) if sent else None,
    }


def replay_summary(statuses: Mapping[str, int], sent: int, first_sent: float | None, last_sent: float | None,
                   last_end: float | None, interrupted: bool, pre: Preflight, scraped: Iterable[str]) -> ReplaySummary:
    """The replay's totals stored as run.json ``summary.replay``, by one process or merged from its workers:
    statuses, the achieved send rate and the span from the first send to the last end, the endpoints."""
    span = (last_sent - first_sent) if sent > 1 and first_sent is not None and last_sent is not None else None
    return {"statuses": dict(statuses), "sent": sent,
            "send_rate_rps": round((sent - 1) / span, 3) if span else None,
            "duration_s": round(last_end - first_sent, 6) if last_end is not None and first_sent is not None else None,
            "interrupted": interrupted, "endpoints": [ep.url for ep in pre.endpoints], "models": pre.models,
            "notes": pre.notes, "scraped_metrics": sorted(set(scraped)),
            "prompt_lengths": pre.prompt_lengths,
            "prompt_length_check": pre.length_check}
