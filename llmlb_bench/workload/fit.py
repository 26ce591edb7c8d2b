"""Fit a workload spec to a trace, so look-alike traces can be generated at any scale and rate.

Per tenant of the trace:

* arrivals: the trace is cut into windows (600 s by default, ServeGen's
  convention); each window gets its own rate, inter-arrival CV and renewal
  family (Poisson, Gamma or Weibull with that CV, whichever is closest to the
  window's normalised gaps by KS distance). The result is a ``windows``
  arrival process that follows the original's rate curve and burstiness.
* lengths: candidates are fitted by maximum likelihood (exponential,
  lognormal, Pareto, a two-component lognormal mixture by EM in log space)
  and scored by the two-sample KS distance between the data and a sample of
  the candidate rounded and capped as the generator will produce it. The
  simplest candidate within ``tolerance`` of KS wins; when none is, an
  empirical quantile table (101 points plus the far tail) is used, which
  reproduces any shape.
* input/output dependence: a Gaussian copula whose correlation matches the
  data's Spearman rho (rho_gauss = 2 sin(pi rho_s / 6)).
* kind, SLO class and priority: each tenant's most common value.

Sessions, dependencies and prefix sharing are not fitted (the spec is
single-turn); the report says so when the trace has them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypedDict, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy import special, stats

from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import Value
from llmlb_bench.workload.arrivals import weibull_shape
from llmlb_bench.workload.distributions import (BoundedPareto, Distribution, EmpiricalQuantiles, Exponential, Lengths,
                                                Lognormal, Mixture)

#: A parametric candidate is kept while its KS distance stays below this.
TOLERANCE = 0.02
#: Cap on the sample used to score candidates (KS resolution ~ 1/sqrt(n)).
SCORE_SAMPLE = 200_000
DEFAULT_WINDOW_S = 600.0


@dataclass
class LengthFit:
    lengths: Lengths
    ks: float
    candidates: dict[str, float]


class LengthChoice(TypedDict):
    """The length distribution chosen for one column, its KS distance, and every candidate's."""

    dist: str
    ks: float
    candidates: dict[str, float]


class TenantFit(TypedDict):
    """What ``trace fit`` chose for one tenant (shown in its table, and in the spec's comment)."""

    requests: int
    rate_rps: float
    input: LengthChoice
    output: LengthChoice
    io_correlation: float


class FitReport(TypedDict):
    window_s: float
    span_s: float
    tenants: dict[str, TenantFit]


@dataclass
class FitResult:
    spec: dict[str, Value]
    report: FitReport
    notes: list[str] = field(default_factory=list)


def _candidates(x: np.ndarray) -> dict[str, Distribution]:
    pos = np.maximum(x, 1.0)
    logs = np.log(pos)
    out: dict[str, Distribution] = {"exponential": Exponential(float(max(x.mean(), 1e-9)))}
    if logs.std() > 0:
        out["lognormal"] = Lognormal(float(logs.mean()), float(logs.std()))
        low, high = float(pos.min()), float(pos.max())
        if high > low:
            alpha = len(pos) / float(np.sum(np.log(pos / low))) if np.sum(np.log(pos / low)) > 0 else 1.0
            out["pareto"] = BoundedPareto(alpha=alpha, low=low, high=high)
        mix = _lognormal_mixture(logs)
        if mix is not None:
            out["mixture"] = mix
    return out


def _lognormal_mixture(logs: np.ndarray, iterations: int = 60) -> Distribution | None:
    """Two-component Gaussian mixture on log lengths by EM (e.g. reasoning: short and long answers)."""
    mu = np.quantile(logs, [0.25, 0.75])
    sd = np.full(2, max(logs.std() / 2, 1e-3))
    w = np.array([0.5, 0.5])
    for _ in range(iterations):
        dens = w * stats.norm.pdf(logs[:, None], mu, sd)
        total = dens.sum(axis=1, keepdims=True)
        total[total == 0] = 1e-300
        r = dens / total
        nk = r.sum(axis=0)
        if np.any(nk < 1e-6 * len(logs)):
            return None
        w = nk / len(logs)
        mu = (r * logs[:, None]).sum(axis=0) / nk
        sd = np.sqrt((r * (logs[:, None] - mu) ** 2).sum(axis=0) / nk)
        sd = np.maximum(sd, 1e-3)
    return Mixture(w, [Lognormal(float(m), float(s)) for m, s in zip(mu, sd)])


def _empirical(x: np.ndarray) -> Distribution:
    q = np.concatenate([np.linspace(0.0, 0.99, 100), [0.995, 0.999, 1.0]])
    return EmpiricalQuantiles(q, np.quantile(x, q))


def fit_lengths(values: np.ndarray, seed: int = 0, tolerance: float = TOLERANCE) -> LengthFit:
    """Choose a length distribution for ``values`` by goodness of fit (see the module doc)."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    sample = x if len(x) <= SCORE_SAMPLE else rng.choice(x, SCORE_SAMPLE, replace=False)
    lo, hi = int(x.min()), int(x.max())

    def score(dist: Distribution) -> float:
        gen = Lengths(dist, min=lo, max=hi).sample(np.random.default_rng(seed + 1), len(sample))
        return float(stats.ks_2samp(sample, gen).statistic)

    candidates = _candidates(x)
    scores = {name: score(d) for name, d in candidates.items()}
    best = None
    for name in ("exponential", "lognormal", "pareto", "mixture"):  # simplest first
        if name in scores and scores[name] <= tolerance:
            best = name
            break
    if best is None:
        empirical = _empirical(x)
        scores["empirical"] = score(empirical)
        return LengthFit(Lengths(empirical, min=lo, max=hi), scores["empirical"], scores)
    return LengthFit(Lengths(candidates[best], min=lo, max=hi), scores[best], scores)


def _family(gaps: np.ndarray) -> tuple[str, float]:
    """Renewal family and CV for one window's gaps."""
    if len(gaps) < 8 or gaps.mean() <= 0:
        return "poisson", 1.0
    g = gaps / gaps.mean()
    cv = float(np.clip(g.std(), 0.06, 19.0))
    k_gamma = 1 / cv**2
    k_weib = weibull_shape(cv)
    scale_weib = 1 / math.exp(special.gammaln(1 + 1 / k_weib))
    ks = {
        "poisson": stats.kstest(g, "expon").statistic,
        "gamma": stats.kstest(g, "gamma", args=(k_gamma, 0, 1 / k_gamma)).statistic,
        "weibull": stats.kstest(g, "weibull_min", args=(k_weib, 0, scale_weib)).statistic,
    }
    best = min(ks, key=lambda k: ks[k])
    return best, (1.0 if best == "poisson" else round(cv, 4))


def fit_arrivals(arrival_s: np.ndarray, span: float, window_s: float) -> dict[str, Value]:
    """A ``windows`` arrival table for sorted arrival times in [0, span]."""
    n_win = max(1, math.ceil(span / window_s - 1e-9))
    idx = np.minimum((arrival_s // window_s).astype(np.int64), n_win - 1)
    rates, cvs, families = [], [], []
    bounds = np.searchsorted(idx, np.arange(n_win + 1))
    for k in range(n_win):
        t = arrival_s[bounds[k]:bounds[k + 1]]
        covered = min(window_s, span - k * window_s) if k == n_win - 1 else window_s
        rates.append(round(len(t) / covered, 6) if covered > 0 else 0.0)
        fam, cv = _family(np.diff(t))
        families.append(fam)
        cvs.append(cv)
    family: Value = families[0] if len(set(families)) == 1 else families
    return {"process": "windows", "window_s": window_s, "rate": rates, "cv": cvs, "family": family}


V = TypeVar("V")


def _mode(col: pa.ChunkedArray, default: V) -> V:
    """The most frequent value of ``col`` (of the default's type), or the default in an empty column."""
    counts = pc.value_counts(col.drop_null() if col.null_count else col)
    if len(counts) == 0:
        return default
    best = counts.to_pylist()  # one entry per distinct value
    mode: V = max(best, key=lambda v: v["counts"])["values"]
    return mode


def fit_trace(table: pa.Table, window_s: float | None = None, seed: int = 0, name: str = "fit") -> FitResult:
    """Fit a spec (as a dict) to ``table``; the report holds each choice and its KS distance."""
    if table.num_rows < 10:
        raise UserError(f"too few requests to fit ({table.num_rows}; need at least 10)")
    arrival_all = table.column("arrival_s").to_numpy()
    origin = float(arrival_all.min())
    span = float(arrival_all.max() - origin)
    if span <= 0:
        raise UserError("every request arrives at the same time; no arrival process to fit")
    window = window_s or (DEFAULT_WINDOW_S if span >= 2 * DEFAULT_WINDOW_S else span / max(1, min(10, round(span / 60))))
    tenant_col = table.column("tenant").cast(pa.string())
    tenants: dict[str, Value] = {}
    report: FitReport = {"window_s": window, "span_s": span, "tenants": {}}
    names = pc.unique(tenant_col).to_pylist()  # one per tenant
    for t_name in names:
        mask = pc.equal(tenant_col, t_name)
        sub = table.filter(mask)
        t = np.sort(sub.column("arrival_s").to_numpy() - origin)
        inp = sub.column("input_tokens").to_numpy()
        out = sub.column("output_tokens").to_numpy()
        fin, fout = fit_lengths(inp, seed), fit_lengths(out, seed + 2)
        spec_t: dict[str, Value] = {"arrival": fit_arrivals(t, span, window),
                                    "input": fin.lengths.to_dict(), "output": fout.lengths.to_dict()}
        io_correlation = 0.0
        if len(inp) > 2 and np.ptp(inp) > 0 and np.ptp(out) > 0:
            rs = float(stats.spearmanr(inp, out).statistic)
            rho = float(np.clip(2 * math.sin(math.pi * rs / 6), -0.99, 0.99))
            if abs(rho) >= 0.02:
                spec_t["io_correlation"] = io_correlation = round(rho, 4)
        reasoning = _fit_reasoning(sub, out)
        if reasoning is not None:
            spec_t["reasoning"] = reasoning
        spec_t["kind"] = _mode(sub.column("kind").cast(pa.string()), "chat")
        spec_t["slo_class"] = _mode(sub.column("slo_class").cast(pa.string()), "default")
        spec_t["priority"] = int(_mode(sub.column("priority"), 0))
        tenants[t_name or "default"] = spec_t
        report["tenants"][t_name] = {
            "requests": sub.num_rows, "rate_rps": sub.num_rows / span,
            "input": {"dist": fin.lengths.dist.name, "ks": fin.ks, "candidates": fin.candidates},
            "output": {"dist": fout.lengths.dist.name, "ks": fout.ks, "candidates": fout.candidates},
            "io_correlation": io_correlation,
        }
    notes = []
    if table.column("parent_id").null_count < table.num_rows or table.column("session_id").null_count < table.num_rows:
        notes.append("the trace has sessions or dependent requests; the fitted spec is single-turn")
    if table.column("prefix_hashes").null_count < table.num_rows:
        notes.append("prefix sharing is not fitted; generated requests do not share prefixes")
    spec: dict[str, Value] = {"name": name, "description": f"fitted to a trace of {table.num_rows} requests over {span:.0f} s",
            "seed": seed, "duration_s": span, "tenants": tenants}
    return FitResult(spec, report, notes)


def _fit_reasoning(sub: pa.Table, out: np.ndarray) -> dict[str, Value] | None:
    """A tenant's ``[reasoning]`` table: the share of requests that reason and, among them, the
    quantiles of reasoning / output (the ``ratio`` form, as ServeGen measures it); None without any."""
    col = sub.column("reasoning_tokens") if "reasoning_tokens" in sub.column_names else None
    r = col.fill_null(0).to_numpy() if col is not None else np.zeros(0)
    thinks = (r > 0) & (out > 0)
    if not thinks.any():
        return None
    table: dict[str, Value] = {"ratio": _empirical(r[thinks] / out[thinks]).to_dict()}
    if not thinks.all():
        table["probability"] = round(float(thinks.mean()), 6)
    return table


def compare(original: pa.Table, generated: pa.Table) -> dict[str, float]:
    """How close a generated trace is to the original: length KS distances and mean-rate ratio."""
    def rate(t: pa.Table) -> float:
        a = t.column("arrival_s").to_numpy()
        return (len(a) - 1) / (a.max() - a.min()) if a.max() > a.min() else float("nan")

    return {
        "input_ks": float(stats.ks_2samp(original.column("input_tokens").to_numpy(),
                                         generated.column("input_tokens").to_numpy()).statistic),
        "output_ks": float(stats.ks_2samp(original.column("output_tokens").to_numpy(),
                                          generated.column("output_tokens").to_numpy()).statistic),
        "rate_ratio": rate(generated) / rate(original),
        "requests_original": original.num_rows,
        "requests_generated": generated.num_rows,
    }
