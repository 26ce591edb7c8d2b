"""Which backend served a request, as the client can tell from the response.

Why headers first: a router under test must not be slowed or changed to learn its decisions.
``llmlb serve`` names itself in every completion's ``X-Llmlb-Backend`` header (its listening URL,
which is what a router calls the worker), and the three PyPI routers pass backend response headers
through, so a replay through any of them learns each decision for free
(:func:`llmlb_bench.backend_header.backend_from_headers`, kept below the replayer that reads it). smg also adds its own
``x-smg-routed-worker-id``, which names the worker when the backend does not identify itself
(a real vLLM). Routers that say nothing in-band (sglang-router, vllm-router in front of vLLM) are
covered by :func:`backends_from_log` (their debug logs) or only in aggregate by their per-worker
counters (docs/routers.md, "Recovering decisions").
"""

from __future__ import annotations

import re
from pathlib import Path

#: a debug log line of sglang-router / smg that carries both the request id and the worker URL;
#: the two fields come in either order and may be quoted
_ID = re.compile(r"request_id[=:]\s*\"?([^\s\",}]+)")
_URL = re.compile(r"(?:worker_url|url)[=:]\s*\"?(https?://[^\s\",}]+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def backends_from_log(path: Path) -> dict[str, str]:
    """``request_id -> worker URL`` from a router's debug log (sglang-router and smg with
    ``--log-level debug``); the first URL logged for an id wins (a retry logs another)."""
    found: dict[str, str] = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if "request_id" not in line:
                continue
            line = _ANSI.sub("", line)
            rid, url = _ID.search(line), _URL.search(line)
            if rid and url:
                found.setdefault(rid.group(1), url.group(1).rstrip("/"))
    return found


#: per-worker request counters of the routers' Prometheus endpoints, first present wins:
#: vllm-router counts its policy's decisions; smg (and sglang-router 0.3.2, built on it) counts
#: each worker's circuit-breaker outcomes, one per attempt
COUNTERS = ("vllm_router_policy_decisions_total", "smg_worker_cb_outcomes_total")
_WORKER = re.compile(r'worker="([^"]+)"')


def worker_counts(metrics_text: str) -> dict[str, float]:
    """Requests per worker URL from a router's ``/metrics`` (see :data:`COUNTERS`); {} when none.

    Scraped before and after a run, the difference is the router's own count per backend: a
    per-backend split (not per request) for routers whose backends do not name themselves."""
    sums: dict[str, dict[str, float]] = {}
    for line in metrics_text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, rest = line.partition("{")
        if name not in COUNTERS:
            continue
        worker = _WORKER.search(rest)
        try:
            value = float(rest.rsplit("}", 1)[1].split()[0])
        except (IndexError, ValueError):
            continue
        if worker:
            per = sums.setdefault(name, {})
            per[worker.group(1).rstrip("/")] = per.get(worker.group(1).rstrip("/"), 0.0) + value
    return next((sums[n] for n in COUNTERS if n in sums), {})
