"""Hand-built runs for the metrics and report tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from llmlb_bench.store import RunStore


def seg(start: float, gap: float, count: int) -> dict[str, Any]:
    """One token-time segment: ``count`` tokens from ``start``, ``gap`` apart."""
    return {"start_s": start, "gap_s": gap, "count": count}


def store_run(results: Path, run_id: str, requests: Mapping[str, Sequence[Any]], *,
              series: Mapping[str, Sequence[Any]] | None = None, config: Mapping[str, Any] | None = None,
              backend: str = "test", label: str | None = None, summary: Mapping[str, Any] | None = None) -> Path:
    """Write one run folder through the real store; returns its path."""
    with RunStore(results, config=dict(config or {}), backend=backend, label=label or run_id, run_id=run_id) as run:
        run.requests.write(requests)
        if series:
            run.series.write(series)
        run.summary.update(summary or {})
    return results / run_id


def timed_requests(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Columns from row dicts; scheduled = sent unless given, status ok unless given."""
    keys = sorted({k for r in rows for k in r} | {"scheduled_s", "status"})
    cols: dict[str, list[Any]] = {k: [] for k in keys}
    for i, r in enumerate(rows):
        for k in keys:
            default = {"scheduled_s": r.get("sent_s"), "status": "ok", "request_id": i}.get(k)
            cols[k].append(r.get(k, default))
    if "request_id" not in cols:
        cols["request_id"] = list(range(len(rows)))
    return cols
