"""Percentiles with bootstrap confidence intervals, from one SQL pass per metric.

A metric is a per-run sample of values ``v`` with integer weights ``w``
(weight 1 for per-request figures; a gap's multiplicity for ITL, where one
token-time segment stands for many equal gaps). One window query sorts each
run's values, accumulates weights (``cw``) and returns only the rows whose
ranks lie in a narrow band around each wanted percentile, plus the run's
total weight and weighted sum. Everything else happens in NumPy on those
few rows:

* the point percentile, exactly as the chosen definition computes it over
  the whole sample ("linear": ``numpy.percentile``; "inverse_cdf":
  GuideLLM's weighted inverse CDF);
* its bootstrap confidence interval. A bootstrap resample is N draws from
  the empirical distribution F_n, so its r-th order statistic is
  ``F_n^-1(U_(r))`` with ``U_(r) ~ Beta(r+1, N-r)``, and the next one is
  ``U_(r) + (1-U_(r)) * Beta(1, N-r-1)``. Drawing those two uniforms per
  replicate reproduces the percentile bootstrap exactly, at O(1) cost per
  replicate instead of O(N), which is what makes it usable on ten million
  rows. The band is wide enough (``BAND_Z`` standard deviations of the
  order-statistic rank, about 7, plus two ranks) that a draw falls outside
  it with probability below 1e-11; such a draw is clipped to the band edge.

Replicates are seeded from (seed, run, metric, percentile), so a report is
identical however many runs it shows and in which order.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Literal

import numpy as np

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
BAND_Z = 7.0
Method = Literal["linear", "inverse_cdf"]


def pkey(p: float) -> str:
    """Dictionary key of a percentile: ``p50``, ``p99``, ``p99.9``."""
    return f"p{p:g}"


def band_sql(source: str, percentiles: Iterable[float] = PERCENTILES) -> str:
    """Rows ``(run_id, v, w, cw, n, vw)`` near each percentile of ``source`` (columns run_id, v, w).

    ``cw`` is the cumulative weight up to and including the row (sorted by v),
    ``n`` the run's total weight, ``vw`` its weighted sum. A row covers ranks
    ``cw - w .. cw - 1`` (0-based) and is kept when that range meets a band.
    """
    bands = []
    for p in percentiles:
        q = p / 100.0
        half = f"({BAND_Z!r} * sqrt(n * {q * (1 - q)!r}) + 2)"
        bands.append(f"(cw - 1 >= {q!r} * (n - 1) - {half} AND cw - w <= {q!r} * n + {half})")
    return f"""
WITH g AS (SELECT run_id, v::DOUBLE AS v, w::BIGINT AS w FROM ({source}) WHERE w > 0 AND v IS NOT NULL),
c AS (SELECT run_id, v, w,
             sum(w) OVER (PARTITION BY run_id ORDER BY v ROWS UNBOUNDED PRECEDING) AS cw,
             sum(w) OVER (PARTITION BY run_id) AS n,
             fsum(v * w) OVER (PARTITION BY run_id) AS vw
      FROM g)
SELECT run_id, v, w::BIGINT AS w, cw::BIGINT AS cw, n::BIGINT AS n, vw FROM c
WHERE {' OR '.join(bands)}
ORDER BY run_id, cw
"""


@dataclass(frozen=True)
class Band:
    """The rows of one run near its percentiles: sorted values and cumulative weights."""

    v: np.ndarray
    cw: np.ndarray
    n: int
    mean: float

    def at_rank(self, ranks: np.ndarray) -> np.ndarray:
        """Value of the order statistic with 0-based rank ``ranks`` (clipped to the band)."""
        i = np.searchsorted(self.cw, np.asarray(ranks) + 1, side="left")
        return self.v[np.clip(i, 0, len(self.v) - 1)]

    def quantile_at(self, u: np.ndarray) -> np.ndarray:
        """F_n^-1(u): the smallest value whose cumulative weight reaches u * n."""
        return self.at_rank(np.ceil(np.asarray(u) * self.n) - 1)


def bands_by_run(table: Any) -> dict[str, Band]:
    """Split the rows of :func:`band_sql` by run."""
    cols = {k: table.column(k).to_numpy(zero_copy_only=False) for k in ("run_id", "v", "cw", "n", "vw")}
    out: dict[str, Band] = {}
    if not len(cols["run_id"]):
        return out
    runs = cols["run_id"]
    starts = np.flatnonzero(np.r_[True, runs[1:] != runs[:-1]])
    ends = np.r_[starts[1:], len(runs)]
    for a, b in zip(starts, ends):
        n = int(cols["n"][a])
        out[str(runs[a])] = Band(v=cols["v"][a:b], cw=cols["cw"][a:b], n=n, mean=float(cols["vw"][a]) / n)
    return out


def percentile(band: Band, p: float, method: Method) -> float:
    """The p-th percentile of the whole sample (the band holds every rank it needs)."""
    q = p / 100.0
    if method == "linear":
        h = q * (band.n - 1)
        lo = math.floor(h)
        a, b = band.at_rank(np.array([lo, min(lo + 1, band.n - 1)]))
        t = h - lo
        return float(a + (b - a) * t) if t < 0.5 else float(b - (b - a) * (1 - t))
    # GuideLLM: first value whose cumulative probability reaches q
    rank = max(math.ceil(q * band.n * (1 - 1e-12)) - 1, 0)
    return float(band.at_rank(np.array([rank]))[0])


def bootstrap_ci(band: Band, p: float, method: Method, rng: np.random.Generator,
                 replicates: int = 2000, level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the p-th percentile (see the module docstring)."""
    n, q = band.n, p / 100.0
    if n < 2:
        x = float(band.v[0])
        return x, x
    if method == "linear":
        h = q * (n - 1)
        r = math.floor(h)
        t = h - r
        u1 = rng.beta(r + 1, n - r, replicates)
        u2 = u1 + (1 - u1) * rng.beta(1, n - r - 1, replicates) if r + 1 <= n - 1 else u1
        a, b = band.quantile_at(u1), band.quantile_at(u2)
        stats = a + (b - a) * t
    else:
        r = max(math.ceil(q * n * (1 - 1e-12)) - 1, 0)
        stats = band.quantile_at(rng.beta(r + 1, n - r, replicates))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(stats, [alpha, 1 - alpha])
    return float(lo), float(hi)


def rng_for(seed: int, *key: str) -> np.random.Generator:
    """A generator seeded from the seed and a key, independent of evaluation order."""
    return np.random.default_rng([seed, zlib.crc32("\x1f".join(key).encode())])


def describe(band: Band | None, method: Method, *, seed: int, key: tuple[str, ...],
             percentiles: Iterable[float] = PERCENTILES, ci: bool = True,
             level: float = 0.95) -> dict[str, Any]:
    """``{n, mean, p50, ..., ci: {p50: [lo, hi], ...}}`` for one run's metric (all None when empty)."""
    percentiles = tuple(percentiles)
    if band is None:
        return {"n": 0, "mean": None, **{pkey(p): None for p in percentiles}, "ci": None}
    out: dict[str, Any] = {"n": band.n, "mean": band.mean}
    for p in percentiles:
        out[pkey(p)] = percentile(band, p, method)
    out["ci"] = ({pkey(p): list(bootstrap_ci(band, p, method, rng_for(seed, *key, pkey(p)), level=level))
                  for p in percentiles} if ci else None)
    return out
