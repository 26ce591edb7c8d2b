"""The figures of one cell (attainment, goodput, latency percentiles), computed once, next to the runs.

Summarising a run is SQL over its requests (:func:`metrics.summary.summarize`,
the same figures as ``llmlb report``) and costs about as much as simulating
it (the ITL query walks every token segment), so each worker summarises the
cell it ran, in parallel, and keeps the figures in
``<sweep>/figures/<run_id>.json`` tagged with the cell's key and the SLO they
were judged by. A rerun reuses them; a changed SLO recomputes them from the
stored runs without simulating again.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Literal, TypeAlias

from llmlb_bench.metrics.run_figures import LatencyName, RunFigures
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.store.views import Catalog

FIGURES = "figures"
#: a run's figures a curve plots, flattened (``ttft.p99``, ``goodput``, ...): :func:`run_figures`
Figures: TypeAlias = dict[str, float | None]
LATENCY_STATS: tuple[Literal["mean", "p50", "p90", "p99"], ...] = ("mean", "p50", "p90", "p99")
#: the latency figures a curve plots
CURVE_LATENCIES: tuple[LatencyName, ...] = ("ttft", "tpot", "itl", "e2e")
#: energy and cost figures of a run's summary (GPU catalog prices): what a fleet comparison divides by
ENERGY: tuple[Literal["j_per_good_token", "usd_per_m_good_tokens", "gpus"], ...] = (
    "j_per_good_token", "usd_per_m_good_tokens", "gpus")


def run_figures(summary: RunFigures) -> Figures:
    """The figures a curve plots, flattened from one run's summary (``ttft.p99``, ``goodput``, ...)."""
    out: Figures = {"throughput": summary["request_throughput"],
                                    "output_throughput": summary["output_throughput"],
                                    "realised_rate": summary.get("realised_rate")}
    slo = summary.get("slo")
    if slo is not None:
        out["attainment"] = slo["attainment"]
        out["goodput"] = slo["goodput"]
        out["good_token_throughput"] = slo["good_token_throughput"]
    for name in CURVE_LATENCIES:
        for stat in LATENCY_STATS:
            d = summary.get(name)
            out[f"{name}.{stat}"] = d.get(stat) if d else None
    energy = summary.get("energy")
    for key in ENERGY:
        out[key] = None if energy is None else energy.get(key)
    return out


def _path(root: Path, run_id: str) -> Path:
    return root / FIGURES / f"{run_id}.json"


def cached_figures(root: Path, run_id: str, key: str, slo: str | None) -> Figures | None:
    """Stored figures of this very run under this SLO, or None."""
    try:
        doc = json.loads(_path(root, run_id).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if doc.get("key") != key or doc.get("slo") != slo:
        return None
    figures: Figures = doc["figures"]   # as compute_figures wrote them
    return figures


def compute_figures(root: Path, run_id: str, key: str, slo: str | None, since_s: float = 0.0) -> Figures:
    """Summarise the stored run and keep its figures (written atomically).

    ``since_s`` > 0 judges only the requests scheduled from then on (an
    endpoint capacity probe's warm-up is sent but not judged).
    """
    cat = Catalog([root / run_id])
    if since_s > 0:
        cat.con.execute("ALTER VIEW requests RENAME TO all_requests")
        cat.con.execute(f"CREATE VIEW requests AS SELECT * FROM all_requests WHERE scheduled_s >= {since_s!r}")
    # One thread: DuckDB's parallel float sums finish in varying order, which moves the last bits of a
    # mean between calls; sweeps promise identical figures on every executor. No progress bar: workers
    # share the terminal (and stdout, which may be carrying JSON).
    cat.con.execute("SET threads TO 1")
    cat.con.execute("SET enable_progress_bar = false")
    # per-run bootstrap intervals off: a sweep's intervals come from its repeats (and cost a quarter of the time)
    (summary,) = summarize(cat, Slo.parse(slo), Options(ci=False))
    figures = run_figures(summary)
    path = _path(root, run_id)
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(f".{os.getpid()}-{secrets.token_hex(4)}-{path.name}")
    doc = {"run_id": run_id, "key": key, "slo": slo, "figures": figures, **({"since_s": since_s} if since_s else {})}
    tmp.write_text(json.dumps(doc, sort_keys=True))
    tmp.replace(path)
    return figures
