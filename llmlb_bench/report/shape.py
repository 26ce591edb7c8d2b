"""The report document's shape: what :func:`llmlb_bench.report.document.build` returns and every
renderer (terminal, Markdown, JSON, HTML, figures) reads.

Apart from ``document.py`` so that the renderers, which the document's builder does not import,
can name the shape without loading the metrics behind it.
"""

from __future__ import annotations

from typing import TypedDict

from llmlb_bench.metrics.run_figures import LoadCurve, RunFigures
from llmlb_bench.metrics.slo import SloSpec


class OptionsDoc(TypedDict):
    """The options a report was computed with, as the document records them."""

    slo: SloSpec | None
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


class FigureChange(TypedDict):
    """One headline figure of a comparison: both values, the relative change with its interval and
    p-value (gate.decide.relative_change), Holm-adjusted over the comparison's figures."""

    metric: str
    figure: str
    baseline_value: float | None
    candidate_value: float | None
    change: float
    low: float | None
    high: float | None
    p_value: float | None
    design: str
    direction: str                      # better | worse
    p_adjusted: float | None
    significant: bool


class Comparison(TypedDict):
    """A run against its group's baseline, and the one sentence that says how it compares."""

    candidate: str
    candidate_run: str
    baseline: str
    baseline_run: str
    changes: list[FigureChange]
    sentence: str


class VerdictGroup(TypedDict):
    """The runs of one workload and their baseline (None: ``--baseline`` names none of them)."""

    runs: list[str]
    baseline: str | None
    workload: str


class Verdicts(TypedDict):
    """The report's verdicts (report/verdict.py): every comparison within a workload against its baseline."""

    baseline: str | None
    confidence: float
    groups: list[VerdictGroup]
    groups_note: str | None             # why runs of different groups are not compared (None: one group)
    comparisons: list[Comparison]
    note: str | None                    # why there are no comparisons (too many runs or requests)


class ReportDoc(TypedDict):
    """The report document; see the module docstring. Every renderer reads this and nothing else."""

    left_out: list[LeftOut]
    verdicts: Verdicts | None           # None with one run
    options: OptionsDoc
    runs: list[RunFigures]
    curves: list[LoadCurve]
    common: str                         # the facets every run shares (metrics.identity.common)
    notes: list[str]
