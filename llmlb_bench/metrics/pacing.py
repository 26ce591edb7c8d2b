"""Token pacing: how smoothly tokens arrive, beyond percentiles of single gaps.

Fluidity index (Etalon / Metron: Agrawal et al., "Etalon: Holistic
Performance Evaluation Framework for LLM Inference Systems", 2024; computed
as their reference code does). Every token is a periodic task with a
deadline: the first token ``D_p`` (the TTFT limit) after the request was
sent, each next one ``D_d`` (the TPOT limit) after the previous token. Time
saved by an early token is slack that later tokens may use. Walking the gaps
g_i of a request with slack s (0 at the start):

* met when ``g_i <= D + s``: s += D - g_i, one deadline met;
* missed otherwise: ``floor((g_i - s) / D_d)`` deadlines missed (a stall of
  three periods misses three deadlines; the first token counts
  ``1 + floor((g_1 - D_p) / D_d)``), and s resets to 0.

fluidity index = 1 - missed deadlines / all deadlines of the request. A run
reports its mean, its 1st percentile (the level 99% of requests reach) and
the share of requests at or above 0.9.

Fluid token generation rate (Etalon's deadline-based throughput): for each
request the smallest ``D_d`` at which at most 10% of its decode deadlines
are missed (first token ignored), found by bisection; the run's rate is
1 / the 99th percentile of those deadlines, in tokens per second per
stream: the pace 99% of requests sustain with at most 10% misses.

Slowest-10% gap mean (Mooncake, Qin et al., FAST 2025, which judges token
pacing by the mean of the longest 10% of a stream's gaps rather than a
single percentile): the mean of the largest ceil(N / 10) of a run's N token
gaps, pooled over requests.

Token times come as run-length segments (see ``requests.token_times``), so
every walk above advances over a whole run of equal gaps in closed form and
works across requests at once in NumPy. Very large runs are read as a
block sample (:mod:`llmlb_bench.metrics.sample`), reported as ``sampled``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.metrics import kernels
from llmlb_bench.metrics.run_figures import Fluidity, PacingFigures, StreamPacing
from llmlb_bench.metrics.slo import Slo

FLUID_TARGET_MISS_RATE = 0.1
FLUID_QUANTILE = 0.99
FLUIDITY_LEVEL = 0.9      # named in the fluidity share's key, "share_ge_0.9" (run_figures.Fluidity)
_PRECISION = 2.0 ** -12          # fluid deadlines: final bracket width / the request's largest gap
_POSITION_COST = 2_000           # fixed cost of one walk step, in entry updates (NumPy call overhead)
_GATHER_FROM = 1_000             # entries x lanes of a walk step from which its stalls are gathered


@dataclass(frozen=True)
class Segments:
    """Token rows (:func:`llmlb_bench.metrics.sample.token_rows`) with their token-time segments
    flattened, once, for the two figures that read them all: ITL
    (:func:`llmlb_bench.metrics.latency.itl_gaps`) and pacing (:meth:`Streams.of`). Both also take
    the gap from a segment's last token to the next segment's first, so what they share of it is
    computed here once: ``after`` (a segment follows another of its request) and ``tail``
    (``gap x (count - 1)``, the span from a segment's first token to its last).

    The segments' start, gap and count are Arrow's own memory; ``parent``, ``count`` (as int64),
    ``after`` and ``tail``, which only the NumPy paths read, are computed at their first use: the
    report's kernels (:mod:`llmlb_bench.metrics.kernels`) take each row's range of segments
    (``ranges``: n + 1 offsets from 0; None where a row's list is null) and the counts as read
    (``counts``, int32 in the schema) and compute the rest as they go, as these compute it."""

    table: pa.Table
    start: np.ndarray
    gap: np.ndarray
    counts: np.ndarray      # as read
    ranges: np.ndarray | None
    lists: pa.Array

    @classmethod
    def of(cls, table: pa.Table) -> "Segments":
        tt = table.column("token_times").combine_chunks()
        seg = pc.list_flatten(tt)
        ranges = None
        if tt.null_count == 0:
            bounds = tt.offsets.to_numpy()
            ranges = bounds.astype(np.int64)
            ranges -= ranges[0]
        return cls(table=table, start=seg.field("start_s").to_numpy(zero_copy_only=False),
                   gap=seg.field("gap_s").to_numpy(zero_copy_only=False),
                   counts=seg.field("count").to_numpy(zero_copy_only=False), ranges=ranges, lists=tt)

    @cached_property
    def parent(self) -> np.ndarray:
        """Each segment's row in ``table``."""
        parent: np.ndarray = pc.list_parent_indices(self.lists).to_numpy()
        return parent

    @cached_property
    def count(self) -> np.ndarray:
        """The counts as int64."""
        return self.counts.astype(np.int64)

    @cached_property
    def after(self) -> np.ndarray:
        """Whether each segment is not its request's first."""
        parent = self.parent
        after = np.zeros(len(parent), dtype=bool)
        np.equal(parent[1:], parent[:-1], out=after[1:])
        return after

    @cached_property
    def tail(self) -> np.ndarray:
        """``gap x (count - 1)``."""
        tail: np.ndarray = np.multiply(self.gap, np.subtract(self.count, 1))
        return tail

    def native_ranges(self) -> np.ndarray | None:
        """``ranges`` where the report's kernels can read these segments (no null list, int32 counts
        as the schema has them), else None: the NumPy paths run."""
        if self.ranges is None or self.counts.dtype != np.int32 or self.start.dtype != np.float64 \
                or self.gap.dtype != np.float64:
            return None
        return self.ranges


@dataclass(frozen=True)
class Streams:
    """The token gaps of a run's requests as runs of equal gaps, laid out for a walk across requests.

    Each request's gaps become entries ``(value, mult)``: ``mult`` consecutive
    gaps of ``value`` seconds, in stream order. Requests are ranked by their
    number of entries (longest first), and entries are stored position by
    position: block ``p`` (``value[offsets[p]:offsets[p+1]]``) holds the
    p-th entry of the requests ranked ``0 .. active[p]-1``. A walk then steps
    through positions touching only array prefixes (no gathers), which is
    what keeps it fast on streams of thousands of chunks. ``rank_of`` maps
    request index (the order of ``ttft``) to rank. Requests of equal length
    are ranked by request id, so the layout does not depend on the order the
    rows came in; ``by_id`` is that order of the requests (None: they came
    by request id), for the figures whose sums run in it.
    """

    ttft: np.ndarray
    #: each request's SLO class as an index into ``classes`` (the distinct classes, None for a request
    #: without one): the deadlines are looked up once per class, not once per request
    slo_class: np.ndarray
    classes: list[str | None]
    rank_of: np.ndarray
    value: np.ndarray
    mult: np.ndarray
    offsets: np.ndarray
    by_id: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.ttft)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> "Streams":
        """The streams of token rows (``ttft``, ``slo_class``, ``token_times``)."""
        return cls.of(Segments.of(table))

    @classmethod
    def of(cls, segments: Segments) -> "Streams":
        """The streams of token rows whose segments are flattened already."""
        table, n = segments.table, segments.table.num_rows
        # each segment gives up to two entries, in this order: the gap from the previous segment's last
        # token (one gap; not for a request's first segment) and its own count - 1 gaps. They are
        # scattered straight to their slots, one pass per kind, and every array of the segments' length
        # is made once and then worked in place: on the 1.4M segments of a 100k-request run's sample,
        # each fresh one is 11 MB for the kernel to fault in, which cost more than the arithmetic
        native = kernels.native
        ranges = segments.native_ranges() if native is not None else None
        if native is not None and ranges is not None:    # the same entries in C, one pass each (metrics/kernels.py)
            length = np.empty(n, dtype=np.int64)
            native.entry_counts(ranges, segments.counts, length)
        else:
            native = None
            parent, cnt, after = segments.parent, segments.count, segments.after
            spaced = cnt > 1
            per_segment = after.view(np.int8) + spaced.view(np.int8)
            end = np.cumsum(per_segment, dtype=np.int64)
            # each request's entries end where its last segment's do (a request without segments has none)
            last = np.cumsum(np.bincount(parent, minlength=n)) - 1
            ends = np.zeros(n, dtype=np.int64)
            ends[last >= 0] = end[last[last >= 0]]
            length = np.diff(ends, prepend=0)
        ids = table.column("request_id").to_numpy() if "request_id" in table.column_names else np.arange(n)
        by_id = None if bool((ids[1:] >= ids[:-1]).all()) else np.argsort(ids, kind="stable")
        by_length = np.argsort(-length, kind="stable") if by_id is None else by_id[np.argsort(-length[by_id], kind="stable")]
        rank_of = np.empty(n, dtype=np.int64)
        rank_of[by_length] = np.arange(n)
        longest = int(length.max()) if n else 0
        active = n - np.cumsum(np.bincount(length, minlength=longest + 1))[:-1]   # requests reaching each position
        offsets = np.r_[0, np.cumsum(active)]
        if native is not None:
            size = int(offsets[-1])
            value, mult = np.empty(size), np.empty(size, dtype=np.int64)
            native.layout(ranges, segments.counts, np.ascontiguousarray(segments.start),
                          np.ascontiguousarray(segments.gap), np.ascontiguousarray(by_length), offsets, value, mult)
        else:
            value, mult = _scatter(segments, spaced, per_segment, end, ends, length, rank_of, offsets)
        slo_class, classes = _class_index(table.column("slo_class"))
        return cls(ttft=table.column("ttft").to_numpy(zero_copy_only=False).astype(float),
                   slo_class=slo_class, classes=classes, rank_of=rank_of, value=value, mult=mult,
                   offsets=offsets, by_id=by_id)


def _class_index(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str | None]]:
    """Each row's index into the distinct values of ``column``, and those values (None last: the rows
    without a class). By Arrow's hash encoding: on the 100k run, turning the column into a list of
    strings and reading each one's limits cost 0.02 CPU-s, this 0.002."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    classes: list[str | None] = [*arr.dictionary.to_pylist(), None]
    index = arr.indices.fill_null(len(classes) - 1).to_numpy(zero_copy_only=False).astype(np.intp)
    return index, classes


def _scatter(segments: Segments, spaced: np.ndarray, per_segment: np.ndarray, end: np.ndarray, ends: np.ndarray,
             length: np.ndarray, rank_of: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The entries' values and multiplicities at their slots, in NumPy (:meth:`Streams.of`'s reference path)."""
    parent, start, gap, cnt, after = segments.parent, segments.start, segments.gap, segments.count, segments.after
    size = int(end[-1]) if len(end) else 0
    first = end                                   # the segment's first position in its request
    first -= per_segment
    first -= (ends - length)[parent]
    rank = rank_of[parent]
    # one spare slot past the entries: a request's first segment has no gap before it, and sends
    # its own there (so that the segments after can be scattered whole, with no gather of them)
    v = np.empty(size + 1)
    m = np.ones(size + 1, dtype=np.int64)        # a gap between segments is one gap: filled, not scattered
    slot = offsets[first]
    slot += rank
    slot[~after] = size
    between = np.add(start[:-1], segments.tail[:-1])      # a segment's last token
    np.subtract(start[1:], between, out=between)          # to the next segment's first
    v[slot[1:]] = between
    i = np.flatnonzero(spaced)
    first += after
    slot = np.take(offsets, first[i])
    slot += rank[i]
    v[slot], m[slot] = gap[i], cnt[i] - 1
    return v[:size], m[:size]


def deadline_walk(s: Streams, d_decode: np.ndarray, d_prefill: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Missed and total deadlines per request (Etalon's walk; ``d_prefill`` None ignores the first token).

    ``d_decode`` has shape (n,) or (n, K): K deadlines per request walked at
    once (the search for fluid deadlines uses this); results have its shape.
    ``d_prefill`` has shape (n,) (every lane judges the first token against
    it) or that of ``d_decode``, where NaN marks a lane that ignores the first
    token: lanes are walked apart, element by element, so two walks fused into
    two lanes give each what it gives alone, bit for bit.
    """
    d = np.empty(np.shape(d_decode))
    d[s.rank_of] = d_decode
    lanes = d.shape[1:]
    missed = np.zeros(d.shape)
    total = np.zeros(d.shape)
    slack = np.zeros(d.shape)
    if d_prefill is not None:
        ttft: np.ndarray = np.empty(s.n)
        dp: np.ndarray = np.empty_like(d_prefill, dtype=float)
        ttft[s.rank_of], dp[s.rank_of] = s.ttft, d_prefill
        ttft = ttft.reshape((-1,) + (1,) * len(lanes))
        dp = dp.reshape((-1,) + (1,) * len(lanes)) if dp.ndim == 1 else dp
        with np.errstate(invalid="ignore"):
            met = ttft <= dp
            late = np.where(np.isnan(dp), 0.0, 1 + np.floor(np.maximum(ttft - dp, 0) / d))
        total += np.where(met, 1, late)
        missed += np.where(met, 0, late)
        slack = np.broadcast_to(np.where(met, dp - ttft, 0.0), d.shape).copy()
    width = int(np.prod(lanes, dtype=np.int64))
    native = kernels.native
    if native is not None:
        # the loop below in C, entry by entry with the same arithmetic (metrics/kernels.py); the lanes of
        # the positions it gathers kept apart, as there
        native.walk(s.value, s.mult, s.offsets, d, total, missed, slack, width, _GATHER_FROM)
        return missed[s.rank_of], total[s.rank_of]
    value, mult = s.value.reshape((-1,) + (1,) * len(lanes)), s.mult.reshape((-1,) + (1,) * len(lanes))
    flat_d, flat_total, flat_missed, flat_slack = d.reshape(-1), total.reshape(-1), missed.reshape(-1), slack.reshape(-1)
    bounds = s.offsets.tolist()
    with np.errstate(divide="ignore", invalid="ignore"):
        for a, b in zip(bounds[:-1], bounds[1:]):
            k = b - a
            g, m = value[a:b], mult[a:b]
            over = g - d[:k]
            if k * width < _GATHER_FROM:
                # every entry through the stall's arithmetic: on the long tail of positions that few
                # requests reach, NumPy's per-call cost outweighs the work
                sl = slack[:k]
                j = np.where(over > 0, np.minimum(m, np.floor(sl / over)), m)   # met before the slack runs out
                left = sl - j * over
                miss = j < m
                late = np.where(miss, np.floor((g - left) / d[:k]) + (m - j - 1) * np.floor(g / d[:k]), 0.0)
                total[:k] += j + late
                missed[:k] += late
                slack[:k] = np.where(miss, 0.0, left)
                continue
            # on a busy position, the few entries whose gaps exceed the deadline are walked apart
            # (gathered): their slack may run out. Every other entry meets all m deadlines, its slack
            # growing by m x (D - g), the same arithmetic: three passes rather than a dozen. Of the
            # gathered ones, those whose slack lasts end as that arithmetic leaves them too (j = m, no
            # late deadline), so only those whose slack runs out go on to the stall's arithmetic
            slow = (over.reshape(-1) > 0).nonzero()[0]
            row = a + (slow // width if width > 1 else slow)
            ms, os_ = s.mult[row], over.reshape(-1)[slow]
            ss = flat_slack[slow]
            j = np.minimum(ms, np.floor(ss / os_))
            out = (j < ms).nonzero()[0]
            at, j, ms = slow[out], j[out], ms[out]
            gs, ds = s.value[row[out]], flat_d[at]
            left = ss[out] - j * os_[out]
            late = np.floor((gs - left) / ds) + (ms - j - 1) * np.floor(gs / ds)
            total_s, missed_s = flat_total[at] + (j + late), flat_missed[at] + late
            total[:k] += m
            slack[:k] -= m * over
            flat_total[at], flat_missed[at], flat_slack[at] = total_s, missed_s, 0.0
    return missed[s.rank_of], total[s.rank_of]


def _lanes(positions: int, entries: int) -> int:
    """The K of the K-ary search that minimises rounds x (per-position cost + (K - 1) x per-entry cost)."""
    def cost(k: int) -> float:
        return math.log(1 / _PRECISION, k) * (_POSITION_COST * positions + (k - 1) * entries)
    return min(range(2, 17), key=cost)


def subset(s: Streams, keep: np.ndarray) -> Streams:
    """The streams of the requests where ``keep`` (a mask over requests) is set, laid out alike.

    A request's entries and the order they are walked in do not change, and a walk treats every
    request on its own (elementwise), so walking a subset gives each kept request bit for bit what
    walking them all gives it."""
    kept_rank = np.zeros(s.n, dtype=bool)
    kept_rank[s.rank_of[keep]] = True
    kept = np.flatnonzero(kept_rank)              # the kept requests' ranks, ascending
    # a position's block holds the ranks below its active count, so its kept entries are the kept
    # ranks below that count, in rank order: their indices are gathered directly, in time of the
    # kept entries (a mask over every entry cost a pass over all of them, most of them left out)
    counts = np.searchsorted(kept, np.diff(s.offsets))
    last = np.flatnonzero(counts)                # trailing positions no kept request reaches go
    counts = counts[:last[-1] + 1] if len(last) else counts[:0]
    offsets = np.r_[0, np.cumsum(counts)]
    within = np.arange(int(offsets[-1]))
    within -= np.repeat(offsets[:-1], counts)     # each kept entry's place in its position's block
    entry = kept[within]
    entry += np.repeat(s.offsets[:len(counts)], counts)
    new_rank = np.cumsum(kept_rank) - 1           # kept requests keep their order (longest first)
    return Streams(ttft=s.ttft[keep], slo_class=s.slo_class[keep], classes=s.classes,
                   rank_of=new_rank[s.rank_of[keep]], value=s.value[entry], mult=s.mult[entry], offsets=offsets)


def largest_gaps(s: Streams) -> np.ndarray:
    """Each request's largest gap (0 without one): the top of its search bracket."""
    hi: np.ndarray = np.zeros(s.n)
    for a, b in zip(s.offsets[:-1], s.offsets[1:]):
        np.maximum(hi[:b - a], s.value[a:b], out=hi[:b - a])
    out: np.ndarray = hi[s.rank_of]
    return out


def _missed_at_most_target(s: Streams, deadline: float) -> np.ndarray:
    """Per request, whether at most 10% of its decode deadlines are missed at ``deadline`` (the search's test)."""
    missed, total = deadline_walk(s, np.full(s.n, deadline), None)
    ok: np.ndarray = missed <= FLUID_TARGET_MISS_RATE * total
    return ok


def first_guess(hi: np.ndarray) -> float:
    """The common deadline :func:`_pivots` walks every request at first: a fifth of the 99th percentile
    of the requests' largest gaps (``hi``, :func:`largest_gaps`)."""
    return 0.2 * float(np.quantile(hi, FLUID_QUANTILE))


def _pivots(s: Streams, hi: np.ndarray, width: np.ndarray, i: int,
            passes: np.ndarray | None = None) -> tuple[np.ndarray, Streams]:
    """Which requests can still be the order statistic of rank ``i`` (or above it), found by walking
    all requests at one common deadline first, then fewer: where the searched deadline lies below the
    ``i``-th, a request is left out of the search.

    Why it is exact: a request's miss rate never rises with the deadline (a larger deadline leaves at
    least the slack a smaller one does after every gap, so it meets every gap the smaller one meets and
    misses the others by fewer periods; in floating point too, every step being a monotone rounding),
    so the search keeps ``lo`` below every deadline that passes and ends with ``hi`` within
    ``width`` (its final bracket) of ``lo``. A request that passes at ``p`` therefore ends below
    ``p + width``; one that fails at ``q`` ends above ``q``. With ``q = p + max(width)``: when at
    least ``n - i`` requests fail at ``q``, the ``i``-th order statistic lies above ``q``, and every
    request that passes at ``p`` lies below it. The first deadline is a guess (a fifth of the 99th
    percentile of the requests' largest gaps); a guess too high is divided by four, one that leaves
    many requests in is raised towards the lowest deadline found too high, each time walking only
    the requests still in. ``passes``: whether each request passes at the first guess, where the
    caller walked it already (:func:`pacing_of`, beside the fluidity walk)."""
    n = s.n
    live = np.arange(n)             # the requests still in, and their streams
    walked = s
    p = first_guess(hi)
    low, too_high = 0.0, math.inf   # the highest common deadline that left requests out, the lowest that did not
    for step in range(8):
        if not 0 < p or too_high < 1.05 * low:
            break
        failed = ~passes if passes is not None and step == 0 else ~_missed_at_most_target(walked, p)
        q = p + float(width[live].max())
        over = subset(walked, failed)
        if int((~_missed_at_most_target(over, q)).sum()) >= n - i:
            live, walked, low = live[failed], over, p
            if len(live) <= 4 * (n - i):
                break
        else:
            too_high = p
        p = math.sqrt(low * too_high) if low and too_high < math.inf else 1.2 * p if low else p / 4
    keep = np.zeros(n, dtype=bool)
    keep[live] = True
    return keep, walked


def fluid_deadlines(s: Streams, quantile: float | None = None, passes: np.ndarray | None = None) -> np.ndarray:
    """Per request, the smallest decode deadline with at most 10% of its deadlines missed.

    A K-ary search: each round walks K - 1 evenly spaced candidates inside
    every request's bracket at once and keeps the sub-interval where the
    miss rate crosses 10%. Wide rounds (K up to 16) amortise the fixed
    per-position cost of a walk on streams of many chunks; with few entries
    per position K falls towards 2 (bisection), which does the least work.
    The bracket starts at (0, largest gap], where no deadline is missed, and
    ends narrower than ``_PRECISION`` of it (0.025%, far below the spread of
    a 99th percentile across requests).

    With ``quantile`` (the only figure a run reports is one quantile of these deadlines), the requests
    that surely lie below the lower of the two order statistics ``numpy.quantile`` interpolates between
    are left out before the search (:func:`_pivots`: two walks at one common deadline, most requests
    out at once) and get a value below it; during the search, a request leaves once its bracket shows
    it can be neither order statistic: wholly below the lowest value the lower one can take, or wholly
    above the highest the upper one can take. Its value is then a bound of its bracket, on the same
    side. Each request still searched is searched as without pruning, so that quantile comes out bit
    for bit as without it (tested), while only the requests near it are walked. ``passes``: whether
    each request meets the search's test at :func:`first_guess` of its largest gaps, walked already.
    """
    hi = largest_gaps(s)
    k = _lanes(len(s.offsets) - 1, len(s.value))
    rounds = math.ceil(math.log(1 / _PRECISION, k))
    if quantile is None or s.n <= 1:
        return _search(s, hi, k, rounds, None)
    i = math.floor(quantile * (s.n - 1))
    j = min(i + 1, s.n - 1)
    # the search's final bracket: (K^-rounds of the largest gap), doubled for the rounding of its steps
    live, walked = _pivots(s, hi, hi * 2.0 * float(k) ** -rounds, i, passes)
    if live.all():
        return _search(s, hi, k, rounds, (i, j))
    out = np.zeros(s.n)             # the requests left out lie below the i-th order statistic, as 0 does
    below = s.n - int(live.sum())
    out[live] = _search(walked, hi[live], k, rounds, (i - below, j - below))
    return out


def _search(s: Streams, hi: np.ndarray, k: int, rounds: int, ranks: tuple[int, int] | None) -> np.ndarray:
    """The K-ary search of :func:`fluid_deadlines` over ``s`` from the brackets (0, ``hi``], pruned to
    the order statistics of ``ranks`` (among these requests) where given."""
    hi = hi.copy()
    lo = np.zeros(s.n)
    steps = np.arange(1, k) / k
    live = np.ones(s.n, dtype=bool)
    walked = s
    for _ in range(rounds):
        if ranks is not None and s.n > 1:
            i, j = ranks
            below = hi < np.partition(lo, i)[i]       # surely under the lower order statistic
            above = lo > np.partition(hi, j)[j]       # surely over the upper one
            lo[below] = hi[below]
            hi[above] = lo[above]
            still = live & ~below & ~above
            if still.sum() < live.sum():
                walked = subset(walked, still[live])
                live = still
        idx = np.flatnonzero(live)
        cand = lo[idx, None] + (hi[idx] - lo[idx])[:, None] * steps
        missed, total = deadline_walk(walked, np.where(cand > 0, cand, 1.0), None)
        ok = (cand > 0) & (missed <= FLUID_TARGET_MISS_RATE * total)
        rows = np.arange(len(idx))
        first_ok = np.where(ok.any(axis=1), ok.argmax(axis=1), k - 1)
        hi_new = np.where(first_ok < k - 1, cand[rows, np.minimum(first_ok, k - 2)], hi[idx])
        lo[idx] = np.where(first_ok > 0, cand[rows, np.maximum(first_ok - 1, 0)], lo[idx])
        hi[idx] = hi_new
    return hi


def slowest_gap_mean(s: Streams, share: float = 0.1) -> float | None:
    """Mean of the largest ceil(share x N) of the N gaps: the gaps above the k-th largest (k = ceil(share
    x N)), entry by entry in the streams' order, and that k-th largest for the rest, summed by NumPy.
    The order is the streams' own, not a sort's, so the terms and their sum depend on nothing but the
    gaps (where they came in the order of an introselect's ties before)."""
    n = int(s.mult.sum())
    if n == 0:
        return None
    k = math.ceil(share * n)
    native = kernels.native
    if native is not None:
        # the k-th largest by a selection on the values' bits (on the 100k run's 1.84M entries, 0.027 ->
        # 0.009-0.015 CPU-s in the report: the NumPy path's negated copy, partition and sort of the 273,000 largest)
        terms = np.empty(min(k, len(s.value) + 1))
        used = native.slowest_terms(s.value, s.mult, k, terms)
        if used is not None:
            return float(terms[:used].sum() / k)
    return float(slowest_terms(s.value, s.mult, k).sum() / k)


def slowest_terms(value: np.ndarray, mult: np.ndarray, k: int) -> np.ndarray:
    """:func:`slowest_gap_mean`'s terms: value x mult of every entry above the k-th largest gap, in
    entry order, then that gap x the gaps still to take."""
    # the k largest gaps lie among the k largest entries (each entry holds at least one gap)
    top = np.argpartition(-value, k - 1)[:k] if k < len(value) else np.arange(len(value))
    order = top[np.argsort(-value[top], kind="stable")]
    threshold = value[order[np.searchsorted(np.cumsum(mult[order]), k)]] + 0.0   # -0.0 as 0.0
    above = value > threshold
    return np.append(value[above] * mult[above], threshold * (k - int(mult[above].sum())))


def pacing_of(s: Streams, slo: Slo | None) -> StreamPacing:
    """The pacing figures of one run's streams."""
    fluidity: Fluidity | None = None
    # the fluid rate's search first walks every request at one common deadline: that walk goes beside
    # the fluidity walk, as a second lane of it (on the 100k run, 0.058 CPU-s against 0.064 apart)
    p = first_guess(largest_gaps(s)) if s.n > 1 else 0.0
    passes = None
    if slo is not None and s.n:
        limits = [slo.limits_for(c) for c in s.classes]
        d_d = np.array([lim.get("tpot", np.nan) for lim in limits])[s.slo_class]
        d_p = np.array([lim.get("ttft", np.inf) for lim in limits])[s.slo_class]
        has = np.isfinite(d_d)
        if has.any():
            d = np.where(has, d_d, 1.0)
            if p > 0:
                missed, total = deadline_walk(s, np.column_stack([d, np.full(s.n, p)]),
                                              np.column_stack([d_p, np.full(s.n, np.nan)]))
                passes = missed[:, 1] <= FLUID_TARGET_MISS_RATE * total[:, 1]     # _missed_at_most_target's test
                missed, total = missed[:, 0], total[:, 0]
            else:
                missed, total = deadline_walk(s, d, d_p)
            fi = np.where(total > 0, 1 - missed / np.maximum(total, 1), 1.0)
            fi = fi[has] if s.by_id is None else fi[s.by_id][has[s.by_id]]     # the mean sums in request id order
            fluidity = {"mean": float(fi.mean()), "p1": float(np.percentile(fi, 1)),
                        "share_ge_0.9": float((fi >= FLUIDITY_LEVEL).mean()), "requests": int(has.sum())}
    rate = None
    if s.n:
        q = float(np.quantile(fluid_deadlines(s, FLUID_QUANTILE, passes), FLUID_QUANTILE))
        rate = 1.0 / q if q > 0 else None
    return {"requests": s.n, "fluidity": fluidity, "fluid_token_rate": rate,
            "slowest10_gap_mean_s": slowest_gap_mean(s)}


def pacing(tokens: Mapping[str, Segments], sampled: Mapping[str, bool], slo: Slo | None) -> dict[str, PacingFigures]:
    """``{run_id: pacing figures}`` for the runs of ``sampled`` (run id -> whether its token rows are a
    sample), from each run's token rows in ``tokens``."""
    return {run_id: {**pacing_of(Streams.of(tokens[run_id]), slo), "sampled": is_sample}
            for run_id, is_sample in sampled.items()}
