"""Exact percentiles with bootstrap confidence intervals, in two scans and no global sort.

A figure is a sample of values ``v`` with integer weights ``w`` (weight 1
for per-request figures; a gap's multiplicity for ITL, where one token-time
segment stands for many equal gaps). Sorting ten million values in SQL is
what made percentiles slow, and only a few ranks are ever needed, so:

1. **Histogram** (one aggregate scan): the total weight of each key (a run,
   or a run and a group) in fine logarithmic buckets of ``v``
   (``BUCKETS_PER_DECADE`` per decade, 0.046% wide; values <= 0 share one
   bucket). Unweighted figures use DuckDB's ``histogram`` aggregate, which
   costs little more than reading the column. Cumulative bucket weights say which buckets hold the ranks
   around each wanted percentile.
2. **Band** (one filtered scan): the rows in those buckets only. With the
   weight of every lower bucket known, each fetched row gets its exact
   cumulative weight ``cw``, i.e. its exact rank range.

Everything else happens in NumPy on those few rows:

* the point percentile, exactly as the chosen definition computes it over
  the whole sample ("linear": ``numpy.percentile``; "inverse_cdf":
  GuideLLM's weighted inverse CDF);
* its bootstrap confidence interval. A bootstrap resample is N draws from
  the empirical distribution F_n, so its r-th order statistic is
  ``F_n^-1(U_(r))`` with ``U_(r) ~ Beta(r+1, N-r)``, and the next one is
  ``U_(r) + (1-U_(r)) * Beta(1, N-r-1)``. Drawing those two uniforms per
  replicate reproduces the percentile bootstrap exactly, at O(1) cost per
  replicate instead of O(N). The band covers ``BAND_Z`` standard
  deviations of the order-statistic rank (about 7, plus two ranks), so a
  draw falls outside it with probability below 1e-11; such a draw is
  clipped to the band edge.

Replicates are seeded from (seed, run, figure, percentile), so a report is
identical however many runs it shows and in which order.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal

import numpy as np
import pyarrow as pa

from llmlb_bench.metrics.sql import quote

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9)
BAND_Z = 7.0
BUCKETS_PER_DECADE = 5000
LOWEST_BUCKET = -12 * BUCKETS_PER_DECADE     # positive values below 1e-12 share it
ZERO_BUCKET = LOWEST_BUCKET - 1              # values <= 0
Method = Literal["linear", "inverse_cdf"]


def pkey(p: float) -> str:
    """Dictionary key of a percentile: ``p50``, ``p99``, ``p99.9``."""
    return f"p{p:g}"


def bucket_sql(expr: str) -> str:
    """SQL bucket of a value: ``BUCKETS_PER_DECADE`` per decade of ``log10``; values <= 0 share one; null stays null."""
    return (f"(CASE WHEN ({expr}) > 0 THEN greatest(floor(log10({expr}) * {BUCKETS_PER_DECADE}), {LOWEST_BUCKET})::INTEGER "
            f"WHEN ({expr}) <= 0 THEN {ZERO_BUCKET} END)")


def band_ranks(n: int, p: float) -> tuple[float, float]:
    """The rank interval (0-based) a percentile and its bootstrap need."""
    q = p / 100.0
    half = BAND_Z * math.sqrt(n * q * (1 - q)) + 2
    return q * (n - 1) - half, q * n + half


@dataclass(frozen=True)
class Histogram:
    """One key's weight per bucket (buckets ascending) and weighted sum."""

    b: np.ndarray
    w: np.ndarray
    vw: float

    @property
    def n(self) -> int:
        return int(self.w.sum())

    def ranges(self, percentiles: Iterable[float]) -> list[tuple[int, int]]:
        """Bucket ranges (inclusive, merged) holding every rank the percentiles' bands need."""
        cw = np.cumsum(self.w)
        first = cw - self.w                          # rank of each bucket's first row
        out: list[tuple[int, int]] = []
        for p in sorted(percentiles):
            lo, hi = band_ranks(self.n, p)
            i = int(np.searchsorted(cw - 1, lo, side="left"))        # first bucket reaching rank lo
            j = int(np.searchsorted(first, hi, side="right")) - 1    # last bucket starting at or before hi
            i, j = min(i, len(self.b) - 1), max(min(j, len(self.b) - 1), 0)
            a, z = int(self.b[min(i, j)]), int(self.b[max(i, j)])
            if out and a <= out[-1][1] + 1:
                out[-1] = (out[-1][0], max(out[-1][1], z))
            else:
                out.append((a, z))
        return out

    def band(self, v: np.ndarray, w: np.ndarray, b: np.ndarray) -> "Band":
        """The fetched rows of whole buckets as a band with exact cumulative weights."""
        order = np.lexsort((v, b))
        v, w, b = v[order], w[order], b[order]
        below = dict(zip(self.b.tolist(), (np.cumsum(self.w) - self.w).tolist()))
        csum = np.cumsum(w)
        starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        within = csum - np.repeat((csum - w)[starts], np.diff(np.r_[starts, len(b)]))
        base = np.array([below[x] for x in b[starts].tolist()], dtype=np.int64)
        cw = np.repeat(base, np.diff(np.r_[starts, len(b)])) + within
        return Band(v=v, cw=cw, n=self.n, mean=self.vw / self.n)


@dataclass(frozen=True)
class Band:
    """Rows of one key near its percentiles: sorted values and their cumulative weights."""

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


def histograms(rows: Iterable[dict[str, Any]], key_of: Callable[[dict[str, Any]], Any]) -> dict[Any, Histogram]:
    """Histograms from rows ``{..., b, w, vw}`` of a bucket aggregate; ``key_of(row)`` names the key."""
    buckets: dict[Any, list[tuple[int, int]]] = {}
    sums: dict[Any, float] = {}
    for r in rows:
        k = key_of(r)
        buckets.setdefault(k, []).append((r["b"], r["w"]))
        sums[k] = sums.get(k, 0.0) + r["vw"]
    out = {}
    for k, bw in buckets.items():
        arr = np.array(sorted(bw), dtype=np.int64)
        out[k] = Histogram(b=arr[:, 0], w=arr[:, 1], vw=sums[k])
    return out


def ranges_sql(column: str, ranges: list[tuple[int, int]]) -> str:
    """SQL: the value ``column`` may lie in a bucket of ``ranges`` (a cheap prefilter on raw values).

    Bucket edges are widened by a millionth so float rounding of ``log10``
    can only let extra rows through; :func:`in_ranges` on the buckets
    DuckDB computed then keeps exactly the rows of the wanted buckets.
    """
    terms = []
    for a, z in ranges:
        lo = "NULL" if a <= ZERO_BUCKET else repr(10 ** (a / BUCKETS_PER_DECADE) * (1 - 1e-6))
        hi = repr(0.0) if z <= ZERO_BUCKET else repr(10 ** ((z + 1) / BUCKETS_PER_DECADE) * (1 + 1e-6))
        terms.append(f"{column} <= {hi}" if lo == "NULL" else f"{column} BETWEEN {lo} AND {hi}")
    return "(" + " OR ".join(terms) + ")"


def in_ranges(b: np.ndarray, ranges: list[tuple[int, int]]) -> np.ndarray:
    """Rows whose bucket lies in a range (a null bucket, read as NaN, in none)."""
    bb = b.astype(float)
    mask = np.zeros(len(b), bool)
    for a, z in ranges:
        mask |= (bb >= a) & (bb <= z)
    return mask


def bands_of(query: Callable[[str], pa.Table], source: str,
             percentiles: Iterable[float] = PERCENTILES) -> dict[str, Band]:
    """Bands of every key of ``source`` (SQL with columns ``key``, ``v``, ``w``), in two scans.

    ``query`` runs SQL and returns an Arrow table (e.g. ``Catalog.query``).
    """
    percentiles = tuple(percentiles)
    src = f"SELECT key, v, w, {bucket_sql('v')} AS b FROM ({source}) WHERE w > 0 AND v IS NOT NULL"
    hists = histograms(query(f"SELECT key, b, sum(w)::BIGINT AS w, fsum(v * w) AS vw FROM ({src}) GROUP BY ALL")
                       .to_pylist(), lambda r: r["key"])
    if not hists:
        return {}
    need = {k: h.ranges(percentiles) for k, h in hists.items()}
    cases = " ".join(f"WHEN {quote(k)} THEN {ranges_sql('v', rng)}" for k, rng in need.items())
    fetched = query(f"SELECT key, v, w, b FROM ({src}) WHERE CASE key {cases} ELSE FALSE END")
    cols = {c: fetched.column(c).to_numpy(zero_copy_only=False) for c in fetched.column_names}
    out = {}
    for k, h in hists.items():
        mask = (cols["key"] == k) & in_ranges(cols["b"], need[k])
        out[k] = h.band(cols["v"][mask].astype(float), cols["w"][mask].astype(np.int64),
                        cols["b"][mask].astype(np.int64))
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
    """``{n, mean, p50, ..., ci: {p50: [lo, hi], ...}}`` for one run's figure (all None when empty)."""
    percentiles = tuple(percentiles)
    if band is None:
        return {"n": 0, "mean": None, **{pkey(p): None for p in percentiles}, "ci": None}
    out: dict[str, Any] = {"n": band.n, "mean": band.mean}
    for p in percentiles:
        out[pkey(p)] = percentile(band, p, method)
    out["ci"] = ({pkey(p): list(bootstrap_ci(band, p, method, rng_for(seed, *key, pkey(p)), level=level))
                  for p in percentiles} if ci else None)
    return out
