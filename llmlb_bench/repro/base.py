"""What a scripted paper reproduction is: a claim, the runs that test it, the figures
that summarise them and a check of the claim's direction and rough size.

A reproduction does not run anything itself; :mod:`llmlb_bench.repro.runner` simulates its
arms, summarises them with the ordinary metrics and renders the report, so every
reproduction is judged by the same code that judges a user's runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pyarrow as pa

from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.sim import ClusterConfig

SCALES = ("small", "full")


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
    args: Mapping[str, Any] = field(default_factory=dict)
    series: str = ""
    x: float | None = None


@dataclass(frozen=True)
class Column:
    """One figure of the results table, read from a run's summary (metrics.summary.summarize)."""

    key: str
    header: str
    get: Callable[[Mapping[str, Any]], float | None]
    fmt: str = "{:.3g}"

    def text(self, summary: Mapping[str, Any]) -> str:
        v = self.get(summary)
        return "-" if v is None else self.fmt.format(v)


@dataclass(frozen=True)
class Verdict:
    """The check's outcome: passed or not, and the figures it compared, in words."""

    passed: bool
    evidence: str


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


def pct(figure: str, p: str) -> Callable[[Mapping[str, Any]], float | None]:
    """A latency percentile (``p``: mean, p50, p90, p99) of a summary."""
    return lambda s: (s.get(figure) or {}).get(p)


#: the table of reproductions judged on end-to-end latency (scheduling and routing by predicted length)
E2E_COLUMNS = (Column("e2e.mean", "E2E mean (s)", pct("e2e", "mean")),
               Column("e2e.p99", "E2E p99 (s)", pct("e2e", "p99")),
               Column("ttft.mean", "TTFT mean (s)", pct("ttft", "mean")))


def slo_figure(key: str) -> Callable[[Mapping[str, Any]], float | None]:
    """attainment / goodput / good_token_throughput of a summary judged against the SLO."""
    return lambda s: (s.get("slo") or {}).get(key)


def energy_figure(key: str) -> Callable[[Mapping[str, Any]], float | None]:
    return lambda s: (s.get("energy") or {}).get(key)


def fairness_figure(key: str) -> Callable[[Mapping[str, Any]], float | None]:
    return lambda s: (s.get("fairness") or {}).get(key)


def ratio(a: float | None, b: float | None) -> float:
    """a / b, infinite when b is zero and a is not (a check compares it to a threshold)."""
    if a is None or b is None:
        return float("nan")
    return a / b if b else (float("inf") if a else 1.0)
