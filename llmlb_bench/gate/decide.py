"""Deciding a gate's rules together, so that noise alone fails a build at most ``1 - confidence`` of
the time over *all* its rules and cases, and a real regression fails it.

**Estimates.** A rule's metric is estimated on each side with the requests
of the side's runs pooled (the report's definitions). A relative rule is
tested on the log of the change, d = log(candidate / baseline); an absolute
rule on the candidate's value.

**Evidence: the runs are the units.** Requests of one run are not
independent (a queue's latencies are correlated over a busy period; a
replay's whole run is slower when its machine is busier; a trace's bursts
set its queueing), so redrawing requests under-states how much a repeat
moves a figure. ``benchmarks/gate_power.py`` measured it: with one run a
side, 31-55% false fails at level 1% (19-31% with the rank-test guard). So,
per case:

* **paired runs**: baseline and candidate runs of the same traces (same
  trace SHA-256 in run.json and the same request ids; the recipe of
  docs/gates.md) are paired, and d is tested on the pairs' own changes
  d_i = log(candidate_i / baseline_i) with a one-sample t-test (k - 1
  degrees of freedom): what a trace contributes cancels in each pair;
* **runs**: otherwise, with two runs a side or more, Welch's t-test on the
  runs' own log values (runs of other traces, as in repeats with other seeds);
* **paired** / **within-run** (one run, or one pair, a side): a circular block
  bootstrap of requests within the run (blocks of about sqrt(n) consecutive
  requests), every per-request metric of the case from the *same* redraw, and
  paired runs from the same redraw of request ids. It cannot see run-to-run
  noise (the output says so), and for relative rules a one-sided Mann-Whitney
  U test must agree too, since the bootstrap's tail for a percentile of a few
  hundred requests is too thin;
* **points**: a run-level figure (Jain's index, energy, cost, a sweep's
  capacity) with one run a side is decided on its point values (exact for the
  deterministic simulator), and stays out of the family.

**Family-wise decision.** Each check (a case and a rule) gets a one-sided
statistic, its violation of the limit in standard errors (positive: worse).
When every check has a joint bootstrap (one run a side), the gate uses the
step-down max-T of Romano and Wolf (2005): the largest t against the
bootstrap distribution of the largest t* over all checks, the next against
the largest over the rest, and so on; the replicates carry the dependence
between rules (TTFT p99 and mean E2E move together), so correlated rules cost
less of the level than Bonferroni charges. Otherwise (t-tests over runs,
where a handful of runs cannot estimate the rules' correlation), Holm's
step-down over the checks' own p-values, valid under any dependence. A rule
**fails** when its point estimate breaks it and its adjusted p-value is below
1 - confidence; a rule broken within noise is **noise**: reported, not failed.

**Repeats needed.** From each check's observed variance at its current runs,
the runs a side (each as long as these) for a one-sided test at the family's
Bonferroni level (1 - confidence) / m to catch a regression ``detect`` beyond
the limit with probability ``power``: the least k with
(t_{1-a/m} + t_power)^2 V / k <= Delta^2, t with the design's degrees of
freedom at k (k - 1 paired, 2k - 2 unpaired, normal for a bootstrap of one
run), V the variance of d per run (per pair; the two sides' summed when
unpaired), Delta = |log(1 - detect)| for higher-is-better rules and
log(1 + detect) otherwise (absolute rules: detect x |limit|).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Mapping, Sequence

import numpy as np

from llmlb_bench.gate.rules import METRICS, Metric, Rule
from llmlb_bench.gate.samples import RunSample

BOOTSTRAP = 2000
DETECT, POWER = 0.05, 0.90       # the change the repeats-needed figure is for, and the power it asks
SINGLE_RUN = "one run a side: run-to-run noise unseen, give repeats"
_CELLS_PER_CHUNK = 4_000_000     # bootstrap rows x requests held in memory at once


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
    p_value: float | None       # family-wise adjusted (step-down max-T) p-value of the violation
    confidence: float
    note: str = ""
    design: str = ""            # paired runs | runs | paired | within-run | points: the evidence (docs/gates.md)
    repeats_needed: int | None = None  # runs a side to catch DETECT beyond the limit with POWER

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        return out


# --- weighted statistics: a bootstrap replicate is a matrix of request counts -----------------------------

def block_length(n: int) -> int:
    """Requests per block of the circular block bootstrap: about sqrt(n), so that a run of 400 requests is
    redrawn as 20 stretches of 20 consecutive requests (a queue's latencies are correlated over a busy period,
    which redrawing single requests would ignore)."""
    return max(1, round(math.sqrt(n)))


def _counts(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` x ``n`` counts: how often each of ``n`` requests (in id order) appears in each of ``k`` circular
    block-bootstrap redraws of ``n`` requests."""
    if n == 0:
        return np.zeros((k, 0), np.int64)
    length = block_length(n)
    blocks = -(-n // length)
    starts = rng.integers(0, n, (k, blocks))
    idx = ((starts[:, :, None] + np.arange(length)) % n).reshape(k, blocks * length)[:, :n]
    idx = idx + (np.arange(k) * n)[:, None]
    return np.bincount(idx.ravel(), minlength=k * n).reshape(k, n)


def _weighted_percentile(x: np.ndarray, w: np.ndarray, q: float) -> np.ndarray:
    """Per row of ``w``, numpy's linear percentile ``q`` of the sample holding x[i] w[row, i] times."""
    k, m = w.shape
    if m == 0:
        return np.full(k, np.nan)
    order = np.argsort(x, kind="stable")
    xs, cum = x[order], np.cumsum(w[:, order], axis=1)
    total = cum[:, -1]
    h = np.maximum(total - 1, 0) * (q / 100)
    lo = np.floor(h)
    step = int(cum.max()) + 1
    flat = (cum + (np.arange(k) * step)[:, None]).ravel()

    def at(rank: np.ndarray) -> np.ndarray:  # the rank-th smallest (0-based) of each row's sample
        pos = np.searchsorted(flat, rank + np.arange(k) * step, side="right") - np.arange(k) * m
        kth: np.ndarray = xs[np.minimum(pos, m - 1)]
        return kth

    a, b = at(lo), at(np.minimum(lo + 1, np.maximum(total - 1, 0)))
    out = a + (h - lo) * (b - a)
    return np.where(total > 0, out, np.nan)


def _flags(metric: Metric, run: RunSample) -> np.ndarray:
    """What a count metric counts: good requests (attainment, goodput) or ok ones (throughput)."""
    return run.good if metric.kind == "share" or metric.column == "good" else run.ok


def _request_stat(metric: Metric, runs: Sequence[RunSample], w: np.ndarray) -> np.ndarray:
    """The metric on the side's pooled requests weighted by ``w`` (rows: replicates; columns: requests)."""
    if metric.kind == "latency":
        x = np.concatenate([r.latency[metric.column] for r in runs])
        valid = ~np.isnan(x)
        x, wv = x[valid], w[:, valid]
        if metric.stat == "mean":
            n = wv.sum(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(n > 0, wv @ x / np.maximum(n, 1), np.nan)
        return _weighted_percentile(x, wv, float(metric.stat[1:]))
    flags = np.concatenate([_flags(metric, r) for r in runs]).astype(float)
    if metric.kind == "share":
        return w @ flags / max(len(flags), 1) if len(flags) else np.full(len(w), np.nan)
    window = sum(r.window_s for r in runs)
    return w @ flags / window if window > 0 else np.full(len(w), np.nan)


def _figure(run: RunSample, path: tuple[str, ...]) -> float | None:
    value: object = run.summary
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return float(value) if isinstance(value, (int, float)) else None


def estimate(m: Metric, runs: Sequence[RunSample]) -> float | None:
    """The side's value of a metric (the report's definition)."""
    if not runs:
        return None
    if m.kind in ("run", "curve"):
        values = [_figure(r, m.path) for r in runs]
        known = [v for v in values if v is not None]
        return None if len(known) < len(values) else float(np.mean(known))
    value = float(_request_stat(m, runs, np.ones((1, sum(len(r.ok) for r in runs))))[0])
    return None if math.isnan(value) else value


# --- evidence on one metric of one case ---------------------------------------------------------------------

def pairing(base: Sequence[RunSample], cand: Sequence[RunSample]) -> list[tuple[RunSample, RunSample]] | None:
    """Baseline and candidate runs matched one to one by trace and request ids, or None when they cannot be."""
    if len(base) != len(cand) or not base:
        return None
    key = lambda r: (r.trace or "", r.run_id)  # noqa: E731
    b, c = sorted(base, key=key), sorted(cand, key=key)
    for x, y in zip(b, c):
        if (not x.trace or x.trace != y.trace or x.request_id is None or y.request_id is None
                or not np.array_equal(x.request_id, y.request_id)):
            return None
    return list(zip(b, c))


def _joint_replicates(metrics: list[Metric], base: Sequence[RunSample], cand: Sequence[RunSample], paired: bool,
                      rng: np.random.Generator, b: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``b`` block-bootstrap replicates of every metric on each side, all from one redraw of each run's requests
    (paired runs share theirs)."""
    total = max(sum(len(r.ok) for r in base) + sum(len(r.ok) for r in cand), 1)
    rows = max(1, _CELLS_PER_CHUNK // total)
    out: tuple[list[list[np.ndarray]], list[list[np.ndarray]]] = ([[] for _ in metrics], [[] for _ in metrics])
    for start in range(0, b, rows):
        k = min(rows, b - start)
        cb = [_counts(len(r.ok), k, rng) for r in base]
        cc = cb if paired else [_counts(len(r.ok), k, rng) for r in cand]
        for acc, side, counts in zip(out, (base, cand), (cb, cc)):
            if side:
                w = np.concatenate(counts, axis=1)
                for j, m in enumerate(metrics):
                    acc[j].append(_request_stat(m, side, w))
    return tuple([np.concatenate(a) if a else np.full(b, np.nan) for a in acc] for acc in out)  # type: ignore[return-value]


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        logs: np.ndarray = np.log(x)
        return logs


def _finite_log(x: np.ndarray) -> np.ndarray:
    """Logs of bootstrap replicates, NaN where a replicate is zero (nanvar leaves those out)."""
    logs: np.ndarray = _log(x)
    logs[~np.isfinite(logs)] = np.nan
    return logs


@dataclass
class Evidence:
    """What the data say about d, the log change (relative) or the candidate's value (absolute)."""
    value: float
    design: str                     # paired runs | runs (over runs) | paired | within-run (bootstrap of one run a side)
    reps: np.ndarray | None = None  # bootstrap replicates of d (paired, within-run)
    se: float = math.nan            # standard error of d from the runs' spread (paired runs, runs)
    df: float = math.nan            # its Welch degrees of freedom
    var_runs: float = math.nan      # variance of d times the runs (per side, summed): for repeats needed

    def interval(self, confidence: float) -> tuple[float, float]:
        if self.reps is not None:
            finite = self.reps[np.isfinite(self.reps)]
            lo, hi = np.percentile(finite, (50 * (1 - confidence), 50 * (1 + confidence))) if len(finite) else (math.nan,) * 2
            return float(lo), float(hi)
        from scipy import stats  # imported where used: scipy costs every CLI command ~0.5 s otherwise

        half = float(stats.t.ppf((1 + confidence) / 2, self.df)) * self.se
        return self.value - half, self.value + half

    def null(self) -> np.ndarray | None:
        """Centred replicates, the null distribution of the statistic (None: runs design)."""
        return None if self.reps is None else self.reps - self.value


def _per_run(m: Metric, runs: Sequence[RunSample], relative: bool) -> np.ndarray:
    values = np.array([np.nan if (v := estimate(m, [r])) is None else v for r in runs], dtype=float)
    return _log(values) if relative else values


def evidence(m: Metric, base: Sequence[RunSample], cand: Sequence[RunSample], relative: bool,
             reps: tuple[np.ndarray, np.ndarray] | None, paired: bool) -> Evidence | None:
    """The evidence on ``m`` (see the module docstring); ``reps``: its joint bootstrap replicates per side."""
    cand_v = estimate(m, cand)
    base_v = estimate(m, base) if relative else None
    if cand_v is None or (relative and not (base_v and cand_v > 0)):
        return None
    value = math.log(cand_v / base_v) if relative and base_v else cand_v   # relative: base_v > 0 (above)
    runs_c, runs_b = len(cand), len(base) if relative else 0
    if reps is not None:
        rb, rc = reps
        d = _finite_log(rc) - _finite_log(rb) if relative else rc
        if relative and not paired:  # independent sides: each side's variance scales with its own runs
            var = float(np.nanvar(_finite_log(rb))) * runs_b + float(np.nanvar(_finite_log(rc))) * runs_c
        else:
            var = float(np.nanvar(d)) * runs_c
        return Evidence(value, "paired" if paired else "within-run", reps=d, var_runs=var)
    if runs_c < 2 or (relative and runs_b < 2):
        return None
    vc = _per_run(m, cand, relative)
    vb = _per_run(m, base, relative) if relative else np.zeros(0)
    if not (np.isfinite(vc).all() and np.isfinite(vb).all()):
        return None
    if paired:  # the pairs' own changes: what a trace contributes cancels, run-to-run noise stays
        diff = vc - vb
        var = float(np.var(diff, ddof=1))
        return Evidence(value, "paired runs", se=math.sqrt(var / runs_c), df=runs_c - 1, var_runs=var)
    sc = float(np.var(vc, ddof=1)) / runs_c
    sb = float(np.var(vb, ddof=1)) / runs_b if relative else 0.0
    se2 = sc + sb
    df = se2 * se2 / (sc * sc / (runs_c - 1) + (sb * sb / (runs_b - 1) if relative else 0.0)) if se2 > 0 else 1.0
    return Evidence(value, "runs", se=math.sqrt(se2), df=df, var_runs=sc * runs_c + sb * runs_b)


def case_evidence(metrics: Sequence[Metric], relative: Sequence[bool], base: list[RunSample], cand: list[RunSample],
                  rng: np.random.Generator, b: int = BOOTSTRAP) -> list[Evidence | None]:
    """The evidence on each metric of one case (see the module docstring).

    With two runs a side or more, the runs are the units: the spread of their own values says how much
    a repeat moves a figure, which redrawing requests within runs does not see (a replay's whole run is
    slower when its machine is busier; a trace's bursts set its queueing). A side of one run (one pair)
    is block-bootstrapped within it, every per-request metric from one joint redraw.
    """
    pairs = pairing(base, cand)
    if pairs is not None:
        base, cand = [p[0] for p in pairs], [p[1] for p in pairs]
    any_rel = any(relative)
    within = len(cand) == 1 or (any_rel and len(base) == 1)
    boot = [m for m in metrics if m.kind not in ("run", "curve")] if within else []
    reps_b, reps_c = _joint_replicates(boot, base if any_rel else [], cand, pairs is not None, rng, b) if boot else ([], [])
    by_metric = {m.name: (rb, rc) for m, rb, rc in zip(boot, reps_b, reps_c)}
    return [evidence(m, base, cand, rel, by_metric.get(m.name), pairs is not None) for m, rel in zip(metrics, relative)]


# --- hypotheses and the family-wise decision -----------------------------------------------------------------

def _rng(seed: int, case: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(zlib.crc32(case.encode()),))))


def _violation(ev: Evidence, rule: Rule) -> tuple[float, np.ndarray | None, float]:
    """t (positive: worse than the limit, in standard errors), its null replicates t* (bootstrap designs)
    and its one-sided marginal p-value."""
    limit = math.log1p(rule.limit) if rule.relative else rule.limit
    gap = (-1.0 if rule.wants_higher else 1.0) * (ev.value - limit)
    if ev.reps is None:
        from scipy import stats

        t = gap / ev.se if ev.se > 0 else (math.inf if gap > 0 else 0.0)
        return t, None, float(stats.t.sf(t, ev.df))
    null = ev.null()
    assert null is not None
    finite = np.isfinite(null)
    sd = float(np.std(null[finite])) if finite.any() else 0.0
    sign = -1.0 if rule.wants_higher else 1.0
    if not sd > 0:
        t, centred = (math.inf if gap > 0 else 0.0), np.zeros(len(null))
    else:
        t, centred = gap / sd, sign * null / sd
    # a replicate without a value (no ok request drawn) counts as exceeding every statistic: conservative
    centred = np.where(finite, centred, math.inf)
    return t, centred, (1 + int(np.sum(centred >= t))) / (1 + len(centred))


def step_down(stats: Sequence[float], nulls: Sequence[np.ndarray]) -> np.ndarray:
    """Romano-Wolf step-down max-T adjusted p-values (one-sided, large t = evidence).

    ``nulls[j]`` holds hypothesis j's centred bootstrap statistics; replicates with the same index are
    one joint draw (draws of independent cases may be combined index by index).
    """
    t = np.asarray(stats, dtype=float)
    if not len(t):
        return np.zeros(0)
    null = np.vstack(nulls)
    order = np.argsort(-t, kind="stable")
    # the maximum over the hypotheses still in play at each step: the last in order alone, then with the one before...
    tail_max = np.maximum.accumulate(null[order][::-1], axis=0)[::-1]
    raw = (1 + (tail_max >= t[order][:, None]).sum(axis=1)) / (1 + null.shape[1])
    out: np.ndarray = np.empty_like(raw)
    out[order] = np.maximum.accumulate(raw)
    return out


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (valid under any dependence)."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    out = np.empty(m)
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return out


def repeats_needed(var_runs: float, rule: Rule, family: int, confidence: float, design: str = "paired runs",
                   detect: float = DETECT, power: float = POWER) -> int | None:
    """Runs a side to catch ``detect`` beyond the rule's limit with ``power`` at Bonferroni level
    (1 - confidence) / family: the least k with (t_{1-a/m} + t_power) sqrt(var_runs / k) <= Delta, t with the
    design's degrees of freedom at k runs (k - 1 paired, 2k - 2 unpaired; normal for a bootstrap of one run)."""
    if rule.relative:
        delta = abs(math.log1p(-detect)) if rule.wants_higher else math.log1p(detect)
    else:
        delta = detect * abs(rule.limit)
    if not delta > 0 or not var_runs >= 0 or not math.isfinite(var_runs):
        return None
    a = (1 - confidence) / max(family, 1)
    z = NormalDist().inv_cdf(1 - a) + NormalDist().inv_cdf(power)
    k = max(1, math.ceil(z * z * var_runs / (delta * delta) - 1e-9))
    if design not in ("paired runs", "runs") or var_runs == 0:
        return k
    from scipy import stats

    def enough(n: int) -> bool:
        df = n - 1 if design == "paired runs" else 2 * n - 2
        t = float(stats.t.ppf(1 - a, df) + stats.t.ppf(power, df))
        return t * t * var_runs / n <= delta * delta

    lo, hi = max(k, 2) - 1, max(k, 2)  # enough(lo) is false or lo is 1, which needs no test
    while not enough(hi):
        lo, hi = hi, 2 * hi
        if hi > 10_000_000:
            return None
    while hi - lo > 1:  # enough is monotone in n: bisect for the least
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return hi


def decide_family(cases: Sequence[tuple[str, list[RunSample], list[RunSample]]], rules: Sequence[Rule],
                  confidence: float = 0.99, seed: int = 0, b: int = BOOTSTRAP,
                  detect: float = DETECT, power: float = POWER) -> list[Verdict]:
    """Every rule on every case, failing at family-wise level 1 - confidence over all of them: step-down
    max-T over the joint bootstrap where every check has one, else Holm over the checks' own p-values."""
    verdicts: list[Verdict] = []
    tested: list[tuple[Verdict, Rule, Evidence, list[RunSample], list[RunSample]]] = []
    for case, base, cand in cases:
        evs = case_evidence([r.metric for r in rules], [r.relative for r in rules], base, cand, _rng(seed, case), b) \
            if cand else [None] * len(rules)
        for rule, ev in zip(rules, evs):
            v = Verdict(case, rule.text, rule.metric.name, rule.relative, rule.describe_limit(), "pass",
                        estimate(rule.metric, base), estimate(rule.metric, cand), None, None, None, None, confidence)
            verdicts.append(v)
            if not cand:
                v.status, v.note = "missing", "case absent from the candidate"
                continue
            if v.candidate is None or (rule.relative and not v.baseline):
                v.status, v.note = "missing", "no value on " + ("the candidate" if v.candidate is None else "the baseline")
                continue
            if rule.relative:
                v.change = v.candidate / v.baseline - 1  # type: ignore[operator]
            point = v.change if rule.relative else v.candidate
            if ev is None:
                v.design = "points"
                if not rule.holds(point):  # type: ignore[arg-type]
                    v.status, v.note = "fail", "single run per side: decided on the point values"
                continue
            v.design = ev.design
            lo, hi = ev.interval(confidence)
            v.low, v.high = (math.expm1(lo), math.expm1(hi)) if rule.relative else (lo, hi)
            tested.append((v, rule, ev, base, cand))
    if tested:
        stats, nulls, marginal = zip(*(_violation(ev, rule) for _, rule, ev, _, _ in tested))
        if all(n is not None for n in nulls):
            length = min(len(n) for n in nulls)
            adjusted = step_down(stats, [n[:length] for n in nulls])
        else:
            adjusted = holm(marginal)
        for (v, rule, ev, base, cand), p in zip(tested, adjusted):
            v.p_value = float(p)
            v.repeats_needed = repeats_needed(ev.var_runs, rule, len(tested), confidence, ev.design, detect, power)
            if ev.design in ("paired", "within-run"):
                v.note = SINGLE_RUN
            if rule.holds(v.change if rule.relative else v.candidate):  # type: ignore[arg-type]
                continue
            rank = _rank_test(rule, base, cand) if ev.design in ("paired", "within-run") and rule.relative else None
            if p < 1 - confidence and (rank is None or rank < 1 - confidence):
                v.status = "fail"
            elif rank is not None and p < 1 - confidence:
                v.status, v.note = "noise", f"Mann-Whitney U p = {rank:.3g} >= {1 - confidence:g}"
            else:
                v.status = "noise"
                v.note = "; ".join(x for x in (f"family-wise p = {p:.3g} >= {1 - confidence:g}", v.note) if x)
    return verdicts


def _rank_test(rule: Rule, base: list[RunSample], cand: list[RunSample]) -> float | None:
    """One-sided Mann-Whitney U p-value that the candidate's requests are worse: with one run a side, a
    guard on the bootstrap, whose tail for a percentile of a few hundred requests is too thin."""
    m = rule.metric
    if m.kind == "latency":
        a, b = (np.concatenate([r.latency[m.column] for r in side]) for side in (cand, base))
        a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    elif m.kind in ("share", "rate"):
        a, b = (np.concatenate([_flags(m, r) for r in side]).astype(float) for side in (cand, base))
    else:
        return None
    if len(a) == 0 or len(b) == 0:
        return None
    if np.ptp(np.concatenate([a, b])) == 0:
        return 1.0  # every request alike on both sides: no evidence of a difference
    from scipy import stats

    return float(stats.mannwhitneyu(a, b, alternative="less" if rule.wants_higher else "greater").pvalue)


def decide(case: str, rule: Rule, base: list[RunSample], cand: list[RunSample], confidence: float = 0.99,
           seed: int = 0, b: int = BOOTSTRAP) -> Verdict:
    """One rule on one case: a family of one."""
    return decide_family([(case, base, cand)], [rule], confidence, seed, b)[0]


# --- the same statistics for a report's verdicts ------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    """The relative change of a figure between two groups of runs."""
    metric: str
    baseline: float | None
    candidate: float | None
    change: float | None         # candidate / baseline - 1
    low: float | None            # ``confidence`` interval of the change
    high: float | None
    p_value: float | None        # two-sided p-value of "no change"
    significant: bool            # p_value < 1 - confidence
    design: str                  # paired runs | runs | paired | within-run | points


def relative_change(metric: str, base: list[RunSample], cand: list[RunSample], confidence: float = 0.95,
                    seed: int = 0, b: int = BOOTSTRAP) -> Change:
    """Candidate vs baseline on one figure of :data:`~llmlb_bench.gate.rules.METRICS` (e.g. ``p99_ttft``,
    ``goodput``) with the gate's evidence (paired by trace where it can be, over runs where they differ by
    trace). One figure, one test: a caller testing many figures at once adjusts the p-values (:func:`holm`)."""
    m = METRICS[metric]
    base_v, cand_v = estimate(m, base), estimate(m, cand)
    change = cand_v / base_v - 1 if base_v and cand_v is not None else None
    ev = case_evidence([m], [True], base, cand, _rng(seed, metric), b)[0] if change is not None else None
    if ev is None:
        return Change(metric, base_v, cand_v, change, None, None, None, False, "points")
    lo, hi = ev.interval(confidence)
    if ev.reps is not None:
        null = ev.null()
        assert null is not None
        p = (1 + int(np.sum(~(np.abs(null) < abs(ev.value))))) / (1 + len(null))
    else:
        from scipy import stats

        p = float(2 * stats.t.sf(abs(ev.value) / ev.se, ev.df)) if ev.se > 0 else float(ev.value == 0)
    p = min(1.0, p)
    return Change(metric, base_v, cand_v, change, math.expm1(lo), math.expm1(hi), p, p < 1 - confidence, ev.design)
