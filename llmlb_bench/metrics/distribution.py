"""Exact percentiles with bootstrap confidence intervals.

A figure is a sample of values ``v`` with integer weights ``w`` (weight 1
for per-request figures; a gap's multiplicity for ITL, where one token-time
segment stands for many equal gaps; tokens for GuideLLM's weighted
figures). A run's sample is read once into NumPy and sorted, with its
cumulative weights; then:

* the point percentile, exactly as the chosen definition computes it
  ("linear": ``numpy.percentile`` over the sample expanded by weight, which
  is DuckDB's ``quantile_cont`` for unit weights; "inverse_cdf": GuideLLM's
  weighted inverse CDF);
* its bootstrap confidence interval. A bootstrap resample is N draws from
  the empirical distribution F_n, so its r-th order statistic is
  ``F_n^-1(U_(r))`` with ``U_(r) ~ Beta(r+1, N-r)``, and the next one is
  ``U_(r) + (1-U_(r)) * Beta(1, N-r-1)``. Drawing those two uniforms per
  replicate reproduces the percentile bootstrap exactly, at O(log N) cost
  per replicate instead of O(N) (tested against brute-force resampling).

Replicates are seeded from (seed, run, figure, percentile), so a report is
identical however many runs it shows and in which order. Sorting in NumPy
rather than in SQL is what keeps ten million rows at a few seconds: one
DuckDB scan hands over the columns, and a sort of a few million floats
costs a fraction of a second.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Iterable, Literal

import numpy as np

from llmlb_bench.metrics import kernels
from llmlb_bench.metrics.run_figures import Distribution, PercentileKey, Percentiles

#: the percentiles a distribution can carry, each with its key
PERCENTILE_KEYS: dict[float, PercentileKey] = {50.0: "p50", 90.0: "p90", 95.0: "p95", 99.0: "p99", 99.9: "p99.9"}
PERCENTILES: tuple[float, ...] = tuple(PERCENTILE_KEYS)
#: Where a CDF is sampled for plots: 0.5% steps to 95%, then finer to 99.9% (the tail is where policies differ).
CDF_PROBABILITIES: tuple[float, ...] = tuple(
    float(p) for p in np.unique(np.r_[np.linspace(0.0, 0.95, 191), 1 - np.geomspace(0.05, 0.001, 40)]))
Method = Literal["linear", "inverse_cdf"]


def pkey(p: float) -> PercentileKey:
    """Dictionary key of a percentile of :data:`PERCENTILES`: ``p50``, ``p99``, ``p99.9``."""
    return PERCENTILE_KEYS[p]


@dataclass(frozen=True)
class Sample:
    """A figure's sample: sorted values and their cumulative weights (None: every weight is 1)."""

    v: np.ndarray
    cw: np.ndarray | None
    n: int
    mean: float

    def at_rank(self, ranks: np.ndarray) -> np.ndarray:
        """Value of the order statistic with 0-based rank ``ranks`` of the sample expanded by weight."""
        ranks = np.asarray(ranks)
        if self.cw is None:
            out: np.ndarray = self.v[np.clip(ranks, 0, len(self.v) - 1).astype(np.int64)]
            return out
        keys = ranks + 1
        if keys.dtype.kind == "f" and self.n < 2 ** 53 and bool(np.all(np.abs(keys) <= 2.0 ** 53)):
            # whole ranks (the bootstrap's ceil(u * n) - 1) searched as integers: the same indices, as
            # every weight sum and every key is exact in a double, without converting all of ``cw`` to
            # doubles per call (1.8M of ITL's per draw, ten draws of 2,000 per 100k-request run)
            whole = keys.astype(np.int64)
            if np.array_equal(whole, keys):
                keys = whole
        i = np.searchsorted(self.cw, keys, side="left")
        return self.v[np.clip(i, 0, len(self.v) - 1)]

    def quantile_at(self, u: np.ndarray) -> np.ndarray:
        """F_n^-1(u): the smallest value whose cumulative weight reaches u * n."""
        return self.at_rank(np.ceil(np.asarray(u) * self.n) - 1)


def sample_of(values: np.ndarray, weights: np.ndarray | None = None, *, scratch: bool = False) -> "Sample | None":
    """A figure's sorted sample (nulls, read as NaN, and zero weights dropped); None when empty.

    ``scratch``: the caller hands ``values`` over, and a writable array without NaN is sorted where it
    lies (the sample keeps it) rather than copied: over five million rows a copy is 40 MB of fresh
    memory per figure and run."""
    v = np.asarray(values, dtype=float)
    keep = ~np.isnan(v)
    if weights is None:
        if keep.all():      # a copy, sorted in place (a plain copy: a tenth of a gather), or the array itself
            v = v if scratch and v.flags.writeable else v.copy()
        else:
            v = v[keep]
        if not len(v):
            return None
        v.sort()
        return Sample(v=v, cw=None, n=len(v), mean=float(v.mean()))
    if np.issubdtype(np.asarray(weights).dtype, np.integer):
        # integer weights (ITL's multiplicities) have no null to drop: neither a float copy nor,
        # where every pair is kept, a gather (1.8M pairs on a 100k-request run's token sample)
        w = np.asarray(weights, dtype=np.int64)
        keep &= w > 0
        if not keep.all():
            v, w = v[keep], w[keep]
    else:
        wf = np.asarray(weights, dtype=float)
        keep &= ~np.isnan(wf) & (wf > 0)
        v, w = v[keep], wf[keep].astype(np.int64)
    if not len(v):
        return None
    v, w = _by_value_then_weight(v, w)
    cw = np.cumsum(w)
    return Sample(v=v, cw=cw, n=int(cw[-1]), mean=float((v * w).sum() / cw[-1]))


def sample_of_parts(values: np.ndarray, weights: np.ndarray, ones: np.ndarray) -> "Sample | None":
    """``sample_of(concatenate([values, ones]), concatenate([weights, 1 for each of ones]))``, the same
    sample to the last bit, without building the concatenation: pairs with integer ``weights`` and
    values of weight 1 (``ones``, handed over: sorted where they lie). ITL's gaps come so
    (:func:`llmlb_bench.metrics.latency.itl_gaps`: a segment's own gaps, and the gaps between
    segments, 75% of the 1.8M of a 100k-request run's token sample), and the weight-1 values are
    the ones :func:`_by_value_then_weight` sorts apart: they need not be concatenated, then told
    apart again. Where that split is not taken (zeros, or only one kind), the concatenation goes
    the general way."""
    v, w, u = np.asarray(values, dtype=float), np.asarray(weights, dtype=np.int64), np.asarray(ones, dtype=float)
    keep = ~np.isnan(v) & (w > 0)
    rest_v, rest_w = (v, w) if keep.all() else (v[keep], w[keep])
    unit = rest_w == 1
    if unit.any():
        u = np.concatenate([u, rest_v[unit]])
        rest_v, rest_w = rest_v[~unit], rest_w[~unit]
    elif not u.flags.writeable:
        u = u.copy()
    u = u[~np.isnan(u)] if np.isnan(u).any() else u
    if not len(u) or not len(rest_v) or not u.all() or not rest_v.all():
        return sample_of(np.concatenate([v, np.asarray(ones, dtype=float)]),
                         np.concatenate([w, np.ones(len(ones), dtype=np.int64)]))
    return sample_of_split(u, rest_v, rest_w)


def sample_of_split(ones: np.ndarray, rest_v: np.ndarray, rest_w: np.ndarray, room: np.ndarray | None = None) -> Sample:
    """The sample of the weight-1 values ``ones`` (handed over: sorted where they lie) and the pairs
    ``(rest_v, rest_w)`` of larger weights, as :func:`sample_of_parts` makes it once it has split its
    input so: neither part empty, no NaN, no 0. The merge, the cumulative weights and the mean's terms
    go in one pass of C where the report's kernels are built (:mod:`llmlb_bench.metrics.kernels`).

    ``room``: a float64 array whose first entries are ``ones`` (``ones`` is ``room[:len(ones)]``), handed
    over too. Where it has room for the whole sample, the kernels merge over ``ones`` in it, from the last
    entry back, and make the mean's terms in place for NumPy's sum, then put the values back: the same
    arrays and mean, without two arrays of fresh memory as long as the sample (on a 100k-request run's
    1.84M gaps, 29 MB that the kernel faults in page by page). The pairs are then handed over as well:
    sorted where they lie, the sort's scratch lent by the cumulative weights' array before they fill it."""
    ones.sort()
    native = kernels.native
    n = len(ones) + len(rest_v)
    if (native is not None and room is not None and room.dtype == np.float64 and room.flags.c_contiguous
            and room.flags.writeable and len(room) >= n and ones.ctypes.data == room.ctypes.data):
        cw = np.empty(n, dtype=np.int64)
        if (3 * len(rest_v) <= n and len(rest_v) and rest_v.all() and rest_v.dtype == np.float64
                and rest_w.dtype == np.int64 and rest_v.flags.c_contiguous and rest_w.flags.c_contiguous
                and rest_v.flags.writeable and rest_w.flags.writeable
                and native.pairs_sorted_in(rest_v, rest_w, cw)):
            rv, rw = rest_v, rest_w
        else:
            rv, rw = pairs_sorted(rest_v, rest_w)
        rv, rw = np.ascontiguousarray(rv), np.ascontiguousarray(rw)
        native.merged_back(room, len(ones), rv, rw, cw)
        v = room[:n]
        native.weigh(v, cw, rv, rw, True)
        total = v.sum()
        native.weigh(v, cw, rv, rw, False)
        return Sample(v=v, cw=cw, n=int(cw[-1]), mean=float(total / cw[-1]))
    rv, rw = pairs_sorted(rest_v, rest_w)
    if native is not None:
        out_v, cw, terms = np.empty(n), np.empty(n, dtype=np.int64), np.empty(n)
        native.merged(np.ascontiguousarray(ones), np.ascontiguousarray(rv), np.ascontiguousarray(rw), out_v, cw, terms)
        return Sample(v=out_v, cw=cw, n=int(cw[-1]), mean=float(terms.sum() / cw[-1]))
    out_v, out_w = _merged(ones, rv, rw)
    cw = np.cumsum(out_w)
    return Sample(v=out_v, cw=cw, n=int(cw[-1]), mean=float((out_v * out_w).sum() / cw[-1]))


def _by_value_then_weight(v: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (v, w) in np.lexsort((w, v))'s order: ties of value ordered by weight, so the
    mean's sum runs in the same order whatever order rows came in.

    Only the sorted pairs are needed, not which row each came from. Most pairs of a sample of
    token gaps have weight 1 (a gap between two segments): those values are sorted alone, by
    NumPy's vectorised sort, and the rest (:func:`pairs_sorted`) merged in after the values
    they tie with, as their larger weights place them. Zeros go the general way: a sort does
    not keep -0.0 and 0.0 apart, and lexsort's order between the two is their input order."""
    unit = w == 1
    if unit.all() or not unit.any() or not v.all():
        return pairs_sorted(v, w)
    ones = v[unit]
    ones.sort()
    return _merged(ones, *pairs_sorted(v[~unit], w[~unit]))


def _merged(ones: np.ndarray, rest_v: np.ndarray, rest_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted weight-1 values and the sorted pairs of larger weights, merged in lexsort's order:
    each pair after the values it ties with."""
    n = len(ones) + len(rest_v)
    at = np.searchsorted(ones, rest_v, side="right") + np.arange(len(rest_v))
    out_v, out_w = np.empty(n), np.ones(n, dtype=np.int64)
    out_v[at], out_w[at] = rest_v, rest_w
    free = np.ones(n, dtype=bool)
    free[at] = False
    out_v[free] = ones
    return out_v, out_w


def pairs_sorted(v: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (v, w) in np.lexsort((w, v))'s order: each value becomes its rank among the
    distinct values, packed with its weight in one 64-bit word, and NumPy's vectorised ``sort``
    orders the words (on 1.8M ITL gaps several times faster than sorting a permutation). With
    ``w`` the positions 0..n-1, the ``w`` returned is ``np.argsort(v, kind="stable")``.
    Where the two do not fit in a word, two stable sorts (radix for small weights) do the same. The
    compiled kernel (metrics/kernels.py) sorts them by radix in C where no value is 0 or NaN (NumPy's
    ranks make -0.0 and 0.0 one value) and no weight is negative: the same arrays, in a third of the time."""
    native = kernels.native
    if native is not None and v.dtype == np.float64 and w.dtype == np.int64 and len(v) and v.all():
        out_v, out_w = np.empty(len(v)), np.empty(len(v), dtype=np.int64)
        if native.pairs_sorted(np.ascontiguousarray(v), np.ascontiguousarray(w), out_v, out_w):
            return out_v, out_w
    u = np.unique(v)
    wbits = int(w.max()).bit_length()
    if wbits + max(len(u) - 1, 1).bit_length() <= 64:
        key = (np.searchsorted(u, v).astype(np.uint64) << np.uint64(wbits)) | w.astype(np.uint64)
        key.sort()
        return u[(key >> np.uint64(wbits)).astype(np.intp)], (key & np.uint64((1 << wbits) - 1)).astype(np.int64)
    by_w = np.argsort(w.astype(np.uint16) if w.max() < 2 ** 16 else w, kind="stable")
    order = by_w[np.argsort(v[by_w], kind="stable")]
    return v[order], w[order]


def percentile(sample: Sample, p: float, method: Method) -> float:
    """The p-th percentile of the sample."""
    q = p / 100.0
    if method == "linear":
        h = q * (sample.n - 1)
        lo = math.floor(h)
        a, b = sample.at_rank(np.array([lo, min(lo + 1, sample.n - 1)]))
        t = h - lo
        return float(a + (b - a) * t) if t < 0.5 else float(b - (b - a) * (1 - t))
    # GuideLLM: first value whose cumulative probability reaches q
    rank = max(math.ceil(q * sample.n * (1 - 1e-12)) - 1, 0)
    return float(sample.at_rank(np.array([rank]))[0])


def bootstrap_ci(sample: Sample, p: float, method: Method, rng: np.random.Generator,
                 replicates: int = 2000, level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of the p-th percentile (see the module docstring)."""
    n, q = sample.n, p / 100.0
    if n < 2:
        x = float(sample.v[0])
        return x, x
    if method == "linear":
        h = q * (n - 1)
        r = math.floor(h)
        t = h - r
        u1 = rng.beta(r + 1, n - r, replicates)
        u2 = u1 + (1 - u1) * rng.beta(1, n - r - 1, replicates) if r + 1 <= n - 1 else u1
        a, b = sample.quantile_at(u1), sample.quantile_at(u2)
        stats = a + (b - a) * t
    else:
        r = max(math.ceil(q * n * (1 - 1e-12)) - 1, 0)
        stats = sample.quantile_at(rng.beta(r + 1, n - r, replicates))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(stats, [alpha, 1 - alpha])
    return float(lo), float(hi)


def rng_for(seed: int, *key: str) -> np.random.Generator:
    """A generator seeded from the seed and a key, independent of evaluation order."""
    return np.random.default_rng([seed, zlib.crc32("\x1f".join(key).encode())])


def describe(sample: Sample | None, method: Method, *, seed: int, key: tuple[str, ...],
             percentiles: Iterable[float] = PERCENTILES, ci: bool = True, level: float = 0.95,
             cdf: bool = False) -> Distribution:
    """``{n, mean, p50, ..., ci: {p50: [lo, hi], ...}}`` for one run's figure (all None when empty);
    with ``cdf``, also ``cdf``: the sample's quantiles at :data:`CDF_PROBABILITIES` (for plots)."""
    percentiles = tuple(percentiles)
    values: Percentiles = {}
    for p in percentiles:
        values[pkey(p)] = None if sample is None else percentile(sample, p, method)
    if sample is None:
        out: Distribution = {"n": 0, "mean": None, **values, "ci": None}
    else:
        out = {"n": sample.n, "mean": sample.mean, **values,
               "ci": ({pkey(p): list(bootstrap_ci(sample, p, method, rng_for(seed, *key, pkey(p)), level=level))
                       for p in percentiles} if ci else None)}
    if cdf:
        out["cdf"] = None if sample is None else [percentile(sample, 100 * q, method) for q in CDF_PROBABILITIES]
    return out
