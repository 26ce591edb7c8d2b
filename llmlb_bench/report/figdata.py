"""The data behind the report's figures: latency CDFs (from the summaries) and timelines (SQL).

* latency CDFs: each figure's quantiles at
  :data:`~llmlb_bench.metrics.distribution.CDF_PROBABILITIES`, computed with
  the run's summary (``Options(cdf=True)``) from the sample it sorts anyway;
* timelines: per run and replica, the series averaged over at most
  ``TIMELINE_POINTS`` equal time buckets (queue, running batch, KV use,
  power), reduced in SQL so a long run costs no more than a short one.
"""

from __future__ import annotations

from typing import TypedDict

from llmlb_bench.metrics.distribution import CDF_PROBABILITIES
from llmlb_bench.metrics.run_figures import LatencyName, RunFigures
from llmlb_bench.metrics.sql import exact_avg
from llmlb_bench.report.shape import ReportDoc
from llmlb_bench.store.views import Catalog

#: Figures drawn as CDFs: (label, summary figure, unit scale, unit).
CDF_FIGURES: tuple[tuple[str, LatencyName, float, str], ...] = (
    ("TTFT", "ttft", 1e3, "ms"), ("TPOT", "tpot", 1e3, "ms"), ("E2E", "e2e", 1.0, "s"))
TIMELINE_POINTS = 400
#: one line per name: its points by coordinate (a CDF's ``x`` and ``p``; a timeline's ``t_s``, ``waiting`` ...)
Lines = dict[str, dict[str, list[float]]]


class FigureData(TypedDict):
    """Everything :mod:`llmlb_bench.report.figures` needs beyond the report document's tables."""

    cdfs: dict[str, Lines]          # label -> run id -> CDF (latency_cdfs)
    timelines: dict[str, Lines]     # run id -> target -> series (timelines)


def latency_cdfs(doc: ReportDoc) -> dict[str, dict[str, dict[str, list[float]]]]:
    """``{label: {run_id: {"x": quantiles (display unit), "p": probabilities}}}`` from the summaries."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for label, fig, scale, _unit in CDF_FIGURES:
        out[label] = {s["run_id"]: {"x": [v * scale for v in cdf], "p": list(CDF_PROBABILITIES)}
                      for s in doc["runs"] if (cdf := _cdf(s, fig))}
    return out


def _cdf(s: RunFigures, fig: LatencyName) -> list[float] | None:
    d = s.get(fig)
    return d.get("cdf") if d else None


def timelines(cat: Catalog) -> dict[str, dict[str, dict[str, list[float]]]]:
    """``{run_id: {target: {t_s, waiting, running, kv_util, power_w}}}``, bucketed."""
    rows = cat.query(f"""
        WITH span AS (SELECT run_id, min(t_s) AS t0, greatest(max(t_s) - min(t_s), 1e-9) AS w FROM series GROUP BY run_id),
        b AS (SELECT s.*, least(floor((s.t_s - span.t0) / span.w * {TIMELINE_POINTS}), {TIMELINE_POINTS - 1}) AS k
              FROM series s JOIN span USING (run_id))
        SELECT run_id, target, k, {exact_avg('t_s')} AS t_s, avg(waiting) AS waiting, avg(running) AS running,
               {exact_avg('kv_blocks_used::DOUBLE / nullif(kv_blocks_total, 0)')} AS kv_util,
               {exact_avg('power_w')} AS power_w
        FROM b GROUP BY ALL ORDER BY run_id, target, k""").to_pylist()
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in rows:
        t = out.setdefault(r["run_id"], {}).setdefault(
            r["target"], {"t_s": [], "waiting": [], "running": [], "kv_util": [], "power_w": []})
        for k in t:
            t[k].append(r[k])
    return out


def figure_data(cat: Catalog, doc: ReportDoc) -> FigureData:
    """The CDFs and timelines of the report's figures."""
    return {"cdfs": latency_cdfs(doc), "timelines": timelines(cat)}
