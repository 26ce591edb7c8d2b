"""The report document: everything a renderer shows, computed once from a catalog.

``build`` returns a :class:`ReportDoc` (a typed dict, JSON-ready after :func:`to_json`): the
options it was made with, the verdicts against the baseline
(:mod:`llmlb_bench.report.verdict`), one summary per run
(:func:`llmlb_bench.metrics.summary.summarize`) and the load curves across
runs (:func:`llmlb_bench.metrics.load.load_curves`). Every renderer —
terminal, Markdown, JSON, HTML — reads this document and nothing else, so
the formats always agree.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.identity import common
from llmlb_bench.metrics.load import load_curves
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.report.notes import run_notes
from llmlb_bench.report.shape import LeftOut, OptionsDoc, ReportDoc
from llmlb_bench.report.verdict import verdicts
from llmlb_bench.store.views import Catalog


@dataclass(frozen=True)
class ReportOptions:
    """What a report computes: the SLO, the summary options and the attainment target of capacity."""

    slo: Slo | None = None
    summary: Options = field(default_factory=Options)
    target: float = 0.9
    baseline: str | None = None          # run id, name or folder of the verdicts' baseline (default: created first)

    def to_dict(self) -> OptionsDoc:
        o = self.summary
        return {"slo": self.slo.to_dict() if self.slo else None,
                "slo_text": self.slo.describe() if self.slo else None,
                "attainment_target": self.target,
                "definitions": o.definitions.value, "seed": o.seed, "ci": o.ci, "confidence": o.confidence,
                "window_s": o.window_s, "price_per_hour": o.price_per_hour, "token_sample": o.token_sample,
                "cdf": o.cdf}

def build(cat: Catalog, options: ReportOptions, where: str = "runs") -> ReportDoc:
    """The report document of every run in ``cat`` that has request rows."""
    runs = summarize(cat, options.slo, options.summary)
    dropped = left_out(cat, {s["run_id"] for s in runs})
    if not runs:
        raise UserError("no runs with request rows found"
                        + (f" ({'; '.join(d['why'] for d in dropped)})" if dropped else ""), where)
    v = verdicts(cat, runs, options.slo, options.baseline, options.summary.confidence, options.summary.seed)
    groups_note = v["groups_note"] if v else None
    return {
        "left_out": dropped,
        "verdicts": v,
        "options": options.to_dict(),
        "runs": runs,
        "curves": load_curves(runs, options.target),
        "common": common(s["facets"] for s in runs),
        "notes": [d["why"] for d in dropped] + ([groups_note] if groups_note else []) + run_notes(runs),
    }

def left_out(cat: Catalog, shown: set[str]) -> list[LeftOut]:
    """Runs found but not in the report, each with why: a broken requests table, or no request rows."""
    out: list[LeftOut] = []
    for r in cat.runs_table.to_pylist():
        if r["run_id"] in shown:
            continue
        why = ("its requests table cannot be read (broken)" if r["status"] == "broken" else
               f"it has no request rows (status {r['status']})")
        out.append({"run_id": r["run_id"], "dir": r["dir"], "status": r["status"],
                    "why": f"run {r['run_id']} ({r['dir']}) left out: {why}"})
    return out

def _finite(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x

def to_json(doc: ReportDoc) -> str:
    """Strict JSON (non-finite numbers become null)."""
    return json.dumps(_finite(doc), indent=2, allow_nan=False) + "\n"
