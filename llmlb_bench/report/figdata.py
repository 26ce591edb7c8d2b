"""The data behind the report's figures that run summaries do not hold: CDFs and timelines.

Both are reduced in SQL before they reach Python, so figures cost the same
on ten million rows as on ten thousand:

* latency CDFs: each figure's quantiles at ``CDF_POINTS`` probabilities
  (finer in the tail, where runs differ), per run;
* timelines: per run and replica, the series averaged over at most
  ``TIMELINE_POINTS`` equal time buckets (queue, running batch, KV use,
  power).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmlb_bench.metrics.sql import REQUEST_METRICS_VIEW
from llmlb_bench.store.views import Catalog

#: Figures drawn as CDFs: (label, per-request column of ``request_metrics``, unit scale, unit).
CDF_FIGURES = (("TTFT", "ttft_s", 1e3, "ms"), ("TPOT", "tpot_s", 1e3, "ms"), ("E2E", "e2e_s", 1.0, "s"))
TIMELINE_POINTS = 400


def cdf_probabilities() -> list[float]:
    """0.5% steps to 95%, then finer steps to 99.9% (the tail is where policies differ)."""
    body = np.linspace(0.0, 0.95, 191)
    tail = 1 - np.geomspace(0.05, 0.001, 40)
    return [float(p) for p in np.unique(np.r_[body, tail])]


def latency_cdfs(cat: Catalog) -> dict[str, dict[str, dict[str, list[float]]]]:
    """``{figure: {run_id: {"x": quantiles (display unit), "p": probabilities}}}``."""
    cat.con.execute(REQUEST_METRICS_VIEW)
    probs = cdf_probabilities()
    plist = "[" + ", ".join(repr(p) for p in probs) + "]"
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for label, col, scale, _unit in CDF_FIGURES:
        rows = cat.query(f"SELECT run_id, quantile_cont({col}, {plist}) AS q FROM request_metrics "
                         f"WHERE status = 'ok' AND {col} IS NOT NULL GROUP BY run_id ORDER BY run_id").to_pylist()
        out[label] = {r["run_id"]: {"x": [v * scale for v in r["q"]], "p": probs} for r in rows}
    return out


def timelines(cat: Catalog) -> dict[str, dict[str, dict[str, list[float]]]]:
    """``{run_id: {target: {t_s, waiting, running, kv_util, power_w}}}``, bucketed."""
    rows = cat.query(f"""
        WITH span AS (SELECT run_id, min(t_s) AS t0, greatest(max(t_s) - min(t_s), 1e-9) AS w FROM series GROUP BY run_id),
        b AS (SELECT s.*, least(floor((s.t_s - span.t0) / span.w * {TIMELINE_POINTS}), {TIMELINE_POINTS - 1}) AS k
              FROM series s JOIN span USING (run_id))
        SELECT run_id, target, k, avg(t_s) AS t_s, avg(waiting) AS waiting, avg(running) AS running,
               avg(kv_blocks_used::DOUBLE / nullif(kv_blocks_total, 0)) AS kv_util, avg(power_w) AS power_w
        FROM b GROUP BY ALL ORDER BY run_id, target, k""").to_pylist()
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in rows:
        t = out.setdefault(r["run_id"], {}).setdefault(
            r["target"], {"t_s": [], "waiting": [], "running": [], "kv_util": [], "power_w": []})
        for k in t:
            t[k].append(r[k])
    return out


def figure_data(cat: Catalog) -> dict[str, Any]:
    """Everything :mod:`llmlb_bench.report.figures` needs beyond the report document."""
    return {"cdfs": latency_cdfs(cat), "timelines": timelines(cat)}
