"""The report document's shape: what :func:`llmlb_bench.report.document.build` returns and every
renderer (terminal, Markdown, JSON, HTML, figures) reads.

Apart from ``document.py`` so that the renderers, which the document's builder does not import,
can name the shape without loading the metrics behind it.
"""

from __future__ import annotations

from typing import Any, TypedDict

from llmlb_bench.metrics.run_figures import RunFigures


class OptionsDoc(TypedDict):
    """The options a report was computed with, as the document records them."""

    slo: dict[str, Any] | None          # Slo.to_dict()
    slo_text: str | None
    attainment_target: float
    # the summary's Options
    definitions: str
    seed: int
    ci: bool
    confidence: float
    window_s: float
    price_per_hour: float | None
    token_sample: int
    cdf: bool


class LeftOut(TypedDict):
    """A run found but not in the report, and why."""

    run_id: str
    dir: str
    status: str
    why: str


class ReportDoc(TypedDict):
    """The report document; see the module docstring. Every renderer reads this and nothing else."""

    left_out: list[LeftOut]
    verdicts: dict[str, Any] | None     # report.verdict.verdicts: None with one run or one per workload
    options: OptionsDoc
    runs: list[RunFigures]
    curves: list[dict[str, Any]]        # metrics.load.load_curves
    common: str                         # the facets every run shares (metrics.identity.common)
    notes: list[str]
