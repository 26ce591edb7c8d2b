"""What a scripted paper reproduction is: a claim, the runs that test it, the figures
that summarise them and a check of the claim's direction and rough size.

A reproduction does not run anything itself; :mod:`llmlb_bench.repro.runner` simulates its
arms, summarises them with the ordinary metrics and renders the report, so every
reproduction is judged by the same code that judges a user's runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, TypeAlias, TypedDict

import pyarrow as pa

from llmlb_bench.metrics.run_figures import LatencyName, RunFigures
from llmlb_bench.sim import ClusterConfig

SCALES = ("small", "full")
#: one figure of a run's summary (metrics.summary.summarize), None where the run has none
Getter: TypeAlias = "Callable[[RunFigures], float | None]"


@dataclass(frozen=True)
class Arm:
    """One simulated run: a trace on a cluster under a policy.

    ``series`` and ``x`` place the run on a figure: arms with an ``x`` are drawn as one
    line per series (a sweep); arms without are drawn as bars.
    """

    label: str
    trace: pa.Table
    cluster: ClusterConfig
    policy: str = "round_robin"
    args: Mapping[str, object] = field(default_factory=dict)
    series: str = ""
    x: float | None = None


@dataclass(frozen=True)
class Column:
    """One figure of the results table, read from a run's summary (metrics.summary.summarize)."""

    key: str
    header: str
    get: Getter
    fmt: str = "{:.3g}"

    def text(self, summary: RunFigures) -> str:
        v = self.get(summary)
        return "-" if v is None else self.fmt.format(v)


@dataclass(frozen=True)
class Verdict:
    """The check's outcome: passed or not, and the figures it compared, in words."""

    passed: bool
    evidence: str


class _VerdictRecord(TypedDict):
    name: str
    passed: bool
    evidence: str
    scale: str
    seed: int


class VerdictRecord(_VerdictRecord, total=False):
    """A report's verdict.json (and what the gallery page lists): with a measured profile, its source."""

    profile: object


@dataclass(frozen=True)
class Reproduction:
    """A paper's claim as runnable code (see docs/repro.md)."""

    name: str
    title: str
    source: str                                   # paper, venue, figure
    claim: str
    setup: str                                    # workload, cluster, policies, in words
    arms: Callable[[str], list[Arm]]              # scale -> the runs
    columns: tuple[Column, ...]
    check: Callable[[dict[str, RunFigures]], Verdict]   # label -> the run's figures
    figure: str                                   # key of the column the figure draws
    x_label: str = ""
    slo: str | None = None
    window_s: float = 10.0                        # fairness windows

    def column(self, key: str) -> Column:
        return next(c for c in self.columns if c.key == key)


def pct(figure: LatencyName, p: Literal["mean", "p50", "p90", "p99"]) -> Getter:
    """A latency percentile (``p``: mean, p50, p90, p99) of a summary."""
    return lambda s: s[figure].get(p)


#: the table of reproductions judged on end-to-end latency (scheduling and routing by predicted length)
E2E_COLUMNS = (Column("e2e.mean", "E2E mean (s)", pct("e2e", "mean")),
               Column("e2e.p99", "E2E p99 (s)", pct("e2e", "p99")),
               Column("ttft.mean", "TTFT mean (s)", pct("ttft", "mean")))


def slo_figure(key: Literal["attainment", "goodput", "good_token_throughput"]) -> Getter:
    """attainment / goodput / good_token_throughput of a summary judged against the SLO."""
    return lambda s: None if (slo := s["slo"]) is None else slo[key]


def energy_figure(key: Literal["j_per_good_token", "price_per_hour", "usd_per_m_good_tokens", "energy_j"]) -> Getter:
    return lambda s: None if (energy := s["energy"]) is None else energy[key]


def fairness_figure(key: Literal["jain_service", "service_gap_mean"]) -> Getter:
    return lambda s: None if (fairness := s["fairness"]) is None else fairness[key]


def hit_rate(s: RunFigures) -> float | None:
    """The share of the run's prompt tokens served from the prefix cache."""
    cached = s["cached_tokens"]
    return cached / s["input_tokens"] if s["input_tokens"] and cached is not None else None


def known(value: float | None, what: str) -> float:
    """A figure a claim's check needs, which every run of its arms has (an SLO's attainment in runs
    judged against one): an error naming it, rather than a comparison with None further on."""
    if value is None:
        raise ValueError(f"a run of the reproduction has no {what}")
    return value


#: how an arm's label and a verdict write a Kendall tau that is undefined: the predictor gave every
#: request of the evaluated trace the same length (tau-b is 0/0), which orders nothing
UNDEFINED_TAU = "undefined"


def tau_text(tau: float | None) -> str:
    """A trained predictor's Kendall tau as labels and verdicts print it: two decimals, or
    :data:`UNDEFINED_TAU` (learn/predictor.py's figures hold None for a constant prediction)."""
    return UNDEFINED_TAU if tau is None else f"{tau:.2f}"


def ratio(a: float | None, b: float | None) -> float:
    """a / b, infinite when b is zero and a is not (a check compares it to a threshold)."""
    if a is None or b is None:
        return float("nan")
    return a / b if b else (float("inf") if a else 1.0)
