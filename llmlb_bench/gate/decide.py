"""Deciding each rule on each case, so that noise alone does not fail a build and a real regression does.

For a rule the gate estimates the metric on each side (requests pooled
over the side's runs), and its sampling distribution by a bootstrap that
resamples requests within each run (runs stay intact, so repeats are
respected). A relative rule looks at the change, candidate / baseline - 1;
an absolute rule at the candidate's value. Then:

* **pass**: the point estimate satisfies the rule;
* **fail**: it does not, the whole ``confidence`` interval lies on the wrong
  side of the limit, and (for relative rules on per-request metrics) a
  one-sided Mann-Whitney U test finds the candidate's requests worse than
  the baseline's at level 1 - confidence. The interval says the change is
  larger than the allowance; the rank test that the two samples differ at
  all, which guards a percentile's interval on few requests;
* **noise**: it does not, but the evidence is within noise; reported, not failed.

Latency statistics resample the requests themselves; attainment, goodput
and throughput count good (ok) requests, whose within-run resample is a
binomial draw, exact and cheap. Run-level figures (Jain's index, energy and
cost per good token) are averaged over runs and resampled by run, and a
sweep's capacity over its seeds; that needs two runs (seeds) per side, and
with one they are decided on the point values (exact for the deterministic
simulator), as the output says. Neither has a rank test: with three values
a side the smallest one-sided Mann-Whitney p is 0.05, so it could never agree.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from llmlb_bench.gate.rules import Rule
from llmlb_bench.gate.samples import RunSample

BOOTSTRAP = 1000
_CELLS_PER_CHUNK = 2_000_000  # bootstrap rows x requests held in memory at once


@dataclass
class Verdict:
    case: str
    rule: str
    metric: str
    relative: bool
    limit: str
    status: str                 # pass | fail | noise | missing
    baseline: float | None
    candidate: float | None
    change: float | None        # candidate / baseline - 1 (relative rules)
    low: float | None           # interval of the change (relative) or of the candidate's value (absolute)
    high: float | None
    p_value: float | None
    confidence: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _statistic(values: np.ndarray, stat: str) -> np.ndarray | float:
    """Mean or linear-interpolation percentile along the last axis (numpy = DuckDB quantile_cont)."""
    if stat == "mean":
        return values.mean(axis=-1)
    return np.percentile(values, float(stat[1:]), axis=-1)


def estimate(rule: Rule, runs: list[RunSample]) -> float | None:
    m = rule.metric
    if m.kind == "latency":
        pooled = np.concatenate([r.latency[m.column] for r in runs])
        return float(_statistic(pooled, m.stat)) if len(pooled) else None
    if m.kind == "share":
        n = sum(len(r.good) for r in runs)
        return sum(int(r.good.sum()) for r in runs) / n if n else None
    if m.kind == "rate":
        duration = sum(r.duration_s for r in runs)
        return sum(int(getattr(r, m.column).sum()) for r in runs) / duration if duration > 0 else None
    values = [_figure(r, m.path) for r in runs]
    return None if any(v is None for v in values) else float(np.mean(values))


def _figure(run: RunSample, path: tuple[str, ...]) -> float | None:
    value: Any = run.summary
    for key in path:
        value = (value or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else None


def bootstrap(rule: Rule, runs: list[RunSample], rng: np.random.Generator, b: int = BOOTSTRAP) -> np.ndarray | None:
    """``b`` bootstrap replicates of :func:`estimate` (None when the side cannot be resampled)."""
    m = rule.metric
    if m.kind == "latency":
        arrays = [r.latency[m.column] for r in runs if len(r.latency[m.column])]
        if not arrays:
            return None
        total = sum(len(a) for a in arrays)
        rows = max(1, _CELLS_PER_CHUNK // total)
        out = []
        for start in range(0, b, rows):
            k = min(rows, b - start)
            sample = np.concatenate([a[rng.integers(0, len(a), (k, len(a)))] for a in arrays], axis=1)
            out.append(np.atleast_1d(_statistic(sample, m.stat)))
        return np.concatenate(out)
    if m.kind in ("share", "rate"):
        flags = [r.good if m.kind == "share" or m.column == "good" else r.ok for r in runs]
        counts = sum(rng.binomial(len(f), f.mean() if len(f) else 0.0, b) for f in flags)
        if m.kind == "share":
            n = sum(len(f) for f in flags)
            return counts / n if n else None
        duration = sum(r.duration_s for r in runs)
        return counts / duration if duration > 0 else None
    values = np.array([_figure(r, m.path) for r in runs], dtype=float)
    if len(values) < 2 or np.isnan(values).any():
        return None
    return values[rng.integers(0, len(values), (b, len(values)))].mean(axis=1)


def _rank_test(rule: Rule, base: list[RunSample], cand: list[RunSample]) -> float | None:
    """One-sided Mann-Whitney U p-value that the candidate's requests are worse (None: not applicable)."""
    m = rule.metric
    if m.kind == "latency":
        a = np.concatenate([r.latency[m.column] for r in cand])
        b = np.concatenate([r.latency[m.column] for r in base])
    elif m.kind in ("share", "rate"):
        pick = (lambda r: r.good) if m.kind == "share" or m.column == "good" else (lambda r: r.ok)
        a = np.concatenate([pick(r) for r in cand]).astype(float)
        b = np.concatenate([pick(r) for r in base]).astype(float)
    else:
        return None
    if len(a) == 0 or len(b) == 0:
        return None
    if np.ptp(np.concatenate([a, b])) == 0:
        return 1.0  # every request alike on both sides: no evidence of a difference
    from scipy import stats  # imported where used: scipy costs every CLI command ~0.5 s otherwise

    return float(stats.mannwhitneyu(a, b, alternative="less" if rule.wants_higher else "greater").pvalue)


def _rng(seed: int, case: str, rule: Rule) -> np.random.Generator:
    key = (zlib.crc32(case.encode()), zlib.crc32(rule.text.encode()))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


def decide(case: str, rule: Rule, base: list[RunSample], cand: list[RunSample], confidence: float = 0.95,
           seed: int = 0, b: int = BOOTSTRAP) -> Verdict:
    """The verdict of ``rule`` on one case (see the module docstring)."""
    rng = _rng(seed, case, rule)
    alpha = 1 - confidence
    q = (100 * alpha / 2, 100 * (1 - alpha / 2))
    v = Verdict(case, rule.text, rule.metric.name, rule.relative, rule.describe_limit(), "pass",
                estimate(rule, base) if base else None, estimate(rule, cand), None, None, None, None, confidence)
    if v.candidate is None or (rule.relative and not v.baseline):
        v.status, v.note = "missing", "no value on " + ("the candidate" if v.candidate is None else "the baseline")
        return v
    cand_boot = bootstrap(rule, cand, rng, b)
    if rule.relative:
        assert v.baseline is not None
        v.change = v.candidate / v.baseline - 1
        base_boot = bootstrap(rule, base, rng, b)
        value = v.change
        if cand_boot is not None and base_boot is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                change = cand_boot / base_boot - 1
            v.low, v.high = (float(x) for x in np.nanpercentile(change, q))
        v.p_value = _rank_test(rule, base, cand)
    else:
        value = v.candidate
        if cand_boot is not None:
            v.low, v.high = (float(x) for x in np.percentile(cand_boot, q))
    if rule.holds(value):
        return v
    if v.low is None:
        v.status, v.note = "fail", "single run per side: decided on the point values"
        return v
    beyond = v.high < rule.limit if rule.wants_higher else v.low > rule.limit
    significant = v.p_value is None or v.p_value < alpha
    if beyond and significant:
        v.status = "fail"
    else:
        v.status = "noise"
        v.note = ("interval reaches the limit" if not beyond else
                  f"Mann-Whitney U p = {v.p_value:.3g} >= {alpha:g}")
    return v
