"""Where each request's prefix-cache hits went: offered, reachable, achieved, and the losses between.

Per request (tokens of its prompt; docs/prefix-cache.md has the definitions and why):

* **offered** ``O``: its leading prompt blocks already seen in the prompt of a request that
  *arrived* earlier, or computed as the reply of the previous turn it extends (one unbounded
  cache shared by everyone; the trace's own reuse);
* **reachable** ``R``: its leading blocks that an earlier-arrived request *on the same target*
  had computed (its prefill finished, ``first_token_s``) before this one's prefill finished:
  an unbounded cache per target, so the routing alone decides it;
* **available** ``V``: the part of ``R`` whose computation had finished when this request was
  sent (the rest was still being computed by the request that brought it: *in flight*);
* **achieved**: ``cached_tokens``, what the engine (simulated or real) served from its cache.

Engines hit in whole cache units (``unit`` tokens: the larger of the trace's hash block and the
engine's KV block) and never count a prompt's last token (vLLM always computes it), so ``O``,
``R`` and ``V`` are cut to ``floor(min(x, input - 1) / unit) * unit`` (``O'``, ``R'``, ``V'``)
before they are compared with ``cached_tokens``. The buckets then add up exactly, per request::

    O = granularity + failed + routing + in_flight + eviction + stale + unmeasured + achieved

with ``granularity = O - O'``; for a request that did not end ok ``failed = O'``; else
``routing = O' - R'``, ``achieved = min(cached, R')``, ``in_flight = R' - max(V', achieved)``,
and the rest of ``R'`` (blocks that had been there and were not hit: capacity) is ``stale`` where
the router predicted it as a hit (``predicted_cached_tokens``: its index still had blocks the
replica had evicted) and ``eviction`` otherwise. Without a ``cached_tokens`` (a server that does
not report it) the whole ``R'`` is ``unmeasured``. Hits beyond what the trace explains
(``cached - achieved``: text a chat template shares) are ``beyond``, outside the sum.

It is computed once per run, when the run ends (both backends call :func:`keep_accounting`), from
the trace and the run's own rows, and written beside them as ``cache_accounting.parquet``, which
the ``cache_accounting`` view serves to ``llmlb query`` and the report. Why then and there: the
buckets need every request's hashes, and the hashes are in the trace, which a confined query
cannot read and a report may no longer find; the requests table is left as it was written (no
rewrite of its token segments); and the work is NumPy over the trace's flattened hashes (the rows
put in arrival order, then per part one vectorised sort of a packed 64-bit key per block: hash,
target, arrival), not a Python walk per block (docs/prefix-cache.md has the measured cost). Every bucket
compares a block only with blocks of the same hash, so the blocks are accounted in parts by hash
(:func:`_parts`) of at most about :data:`CHUNK_BLOCKS`: the working memory is that of one part,
whatever the run's length, and the result the same as in one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.metrics.run_figures import CacheBuckets, CacheTokens, PrefixCacheFigures
from llmlb_bench.schema import ArrowRow, CACHE_ACCOUNTING, META_BLOCK_SIZE, REQUESTS, TableSpec, open_parquet, trace_block_size
from llmlb_bench.store.parts import replace_table, table_files
from llmlb_bench.store.run import ACCOUNTING_FILE, REQUESTS_FILE
from llmlb_bench.trace_columns import keyed_prefix_hashes

if TYPE_CHECKING:
    from llmlb_bench.store import RunStore
    from llmlb_bench.store.views import Catalog

import time as _t
T = {}
_last = [0.0]
def _tick(label):
    now = _t.process_time()
    T[label] = T.get(label, 0.0) + now - _last[0]
    _last[0] = now

#: the loss buckets, in the order of the identity above (all but achieved)
LOSSES = ("granularity", "failed", "routing", "in_flight", "eviction", "stale", "unmeasured")

_NEEDED = ["request_id", "target", "prefill_target", "status", "scheduled_s", "sent_s", "first_token_s",
           "input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens", "predicted_cached_tokens"]


def _first_below(outs: tuple[np.ndarray, ...], level: np.ndarray, owner: np.ndarray, pos: np.ndarray) -> None:
    """Lower ``outs[k][row]`` to the position of the row's first block whose ``level`` is at most
    ``k``, among these blocks (``level``, ``owner`` and ``pos`` aligned; each out starts at the rows'
    lengths): after every part of the blocks, ``outs[k]`` holds how many of each row's blocks are
    above level ``k`` before the first that is not (the levels nest: offered, reachable, ready).

    ``owner`` is non-decreasing (a row's blocks come in prompt order), so a row's first such
    block is the first of its own among them: no scatter-minimum needed. Only the blocks below the
    top level are read again, once per level."""
    miss = np.flatnonzero(level < len(outs))
    if not len(miss):
        return
    level, owner, pos = level[miss], owner[miss], pos[miss]
    for k, out in enumerate(outs):
        at = np.flatnonzero(level <= k) if k + 1 < len(outs) else np.arange(len(level))
        if len(at):
            rows = owner[at]
            first = np.r_[True, rows[1:] != rows[:-1]]
            rows = rows[first]
            out[rows] = np.minimum(out[rows], pos[at[first]])


def _ranks(primary: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rank of each row by (``primary``, request id); NaN sorts last."""
    order = _order_by(primary, ids)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return rank


def _order_by(primary: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The rows' order by (``primary``, request id); NaN sorts last."""
    key = np.where(np.isnan(primary), np.inf, primary)
    order: np.ndarray = np.lexsort((ids, key))
    return order


def _lists(hashes: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list column of hashes as (values, row lengths, offsets); the values without a copy where
    the column is one chunk (null lists have no values)."""
    lengths = pc.list_value_length(hashes).fill_null(0).to_numpy().astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.asarray(pc.list_flatten(hashes).to_numpy(), dtype=np.uint64)
    return values, lengths, offsets


#: blocks accounted at once: the working arrays (a dozen words per block) grow with this, not with the run
CHUNK_BLOCKS = 1 << 20

#: an odd multiplier (2^64 / golden ratio): multiplying by it permutes the 64-bit words and spreads
#: hashes that differ only in their low bits (small integers) over the high ones
_SPREAD = np.uint64(0x9E3779B97F4A7C15)


def _part_bits(blocks: int, chunk: int) -> int:
    """How many top bits of the spread hash name a block's part (:func:`_parts`): parts of about ``chunk``."""
    return max(0, math.ceil(math.log2(max(blocks, 1) / chunk)))


def _parts(values: np.ndarray, replies: np.ndarray, offsets: np.ndarray, bits: int
           ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The blocks in ``2^bits`` parts by hash: per part ``(hashes, index, counts, reply)``, its
    blocks' hashes and indices in ``values`` (in that order), how many of them each row has, and the
    indices in ``replies`` (indices into ``values`` of the reply blocks) of its reply blocks.

    Every bucket compares a block only with blocks of the same hash, so a part that holds whole
    hash groups is accounted on its own, and the result does not depend on how many parts there
    are (tested against one part): the run's length sets how many parts, not how large each is.
    A part is the top bits of the spread hash; beyond the trace, what every part needs is one
    byte per block (its part) and the rows' own arrays."""
    if not bits:
        yield values, np.arange(len(values), dtype=np.int64), np.diff(offsets), np.arange(len(replies), dtype=np.int64)
        return
    part = np.empty(len(values), dtype=np.uint8 if bits <= 8 else np.uint16)
    chunk = 1 << 20
    for a in range(0, len(values), chunk):
        part[a:a + chunk] = (values[a:a + chunk] * _SPREAD) >> np.uint64(64 - bits)
    reply_part = part[replies]
    for k in range(1 << bits):
        index = np.flatnonzero(part == k)
        # each row's first block in the part: a search per row, not per block
        yield np.take(values, index), index, np.diff(np.searchsorted(index, offsets)), np.flatnonzero(reply_part == k)


@dataclass
class _Rows:
    """What the per-block passes read of the rows (aligned with them, the rows in arrival order:
    a row's index is its arrival rank), and the leading blocks they find. A block is reachable when
    the earliest prefill finish rank among the earlier arrivals on its target that computed it is
    below its row's ``done``, and ready when also below ``ready``."""

    provide: np.ndarray     # rank by (first_token_s, request id), or n + 1 for a row that never computed its prompt
    done: np.ndarray        # that rank for a row with a target (no first token ranks last), -1 for none
    ready: np.ndarray       # the smaller of done and how many prefills had finished when the row was sent
    holder: np.ndarray      # index of the row's target in the sorted names, -1 for none
    targets: int            # how many names (0: offered alone, no per-target pass)
    #: out, per row, leading blocks: seen in an earlier arrival's prompt or reply (offered), reachable on
    #: its target, and reachable and computed before it was sent
    leading: tuple[np.ndarray, ...]


def _merged(values: np.ndarray, owner: np.ndarray, counts: np.ndarray, reply_values: np.ndarray,
            provider: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A part's prompt blocks (rows ``owner``, non-decreasing; ``counts`` of them per row) and reply
    blocks (rows ``provider``, also non-decreasing) as one sequence in the order of their rows,
    i.e. of arrival: ``(hashes, owners, at)``, ``at`` where each prompt block went (None: no reply
    blocks, the prompt blocks as they were), a row's reply blocks after its prompt blocks. The
    order of one row's blocks does not matter: a row is never its own earlier arrival."""
    if not len(provider):
        return values, owner, None
    replies = np.bincount(provider, minlength=len(counts))
    before = np.cumsum(replies) - replies                      # reply blocks of the rows before
    at = np.arange(len(owner), dtype=np.int64) + np.take(before, owner)
    put = np.arange(len(provider), dtype=np.int64) + np.take(np.cumsum(counts), provider)
    owners = np.repeat(np.arange(len(counts), dtype=np.int64), counts + replies)
    hashes = np.empty(len(owners), dtype=np.uint64)
    hashes[at], hashes[put] = values, reply_values
    return hashes, owners, at


def _account_part(r: _Rows, values: np.ndarray, owner: np.ndarray, pos: np.ndarray, counts: np.ndarray,
                  reply_values: np.ndarray, provider: np.ndarray, bits: int) -> None:
    """The leading offered, reachable and ready blocks of one part (:func:`_parts`, ``bits`` the
    spread hash's top bits all its blocks share): ``values``, ``owner`` and ``pos`` its prompt
    blocks (``counts`` per row), ``reply_values`` and ``provider`` its reply blocks and their rows.

    One vectorised sort of a 64-bit word per block that packs (the spread hash's next bits, the
    block's target + 1, its place in arrival order) puts the blocks in (hash, target, arrival)
    order; the rare runs where distinct hashes share those bits are sorted again by value. Then a
    block is offered unless its row is the earliest of its hash (a segmented minimum), and per
    (hash, target) group in arrival order the earliest prefill finish among the earlier members
    says whether it was reachable (a running maximum of ``group * big - finish rank``); rows are
    in arrival order, so a block's row is its arrival rank and the rows' arrays are read directly.
    A block's level counts what it is (offered, reachable, ready: each implies the one before)."""
    hashes, owners, at = _merged(values, owner, counts, reply_values, provider)
    size = len(owners)
    if not size:
        return
    ibits = max(size - 1, 1).bit_length()
    tbits = r.targets.bit_length()
    low = tbits + ibits
    key = hashes * _SPREAD
    if bits:
        key <<= np.uint64(bits)
    key &= np.uint64(((1 << 64) - 1) ^ ((1 << low) - 1))
    if tbits:
        key |= np.take((r.holder + 1).astype(np.uint64) << np.uint64(ibits), owners)
    key |= np.arange(size, dtype=np.uint64)
    _tick('key')
    key.sort()
    _tick('sort')
    perm = (key & np.uint64((1 << ibits) - 1)).view(np.int64)
    hv = np.take(hashes, perm)
    _tick('perm_hv')
    start = np.empty(size, dtype=bool)                         # a block whose hash differs from the one before
    start[0] = True
    np.not_equal(hv[1:], hv[:-1], out=start[1:])
    high = key >> np.uint64(low)
    same = high[1:] == high[:-1]
    if (same & start[1:]).any():                               # distinct hashes that share the key's bits
        run = np.cumsum(np.r_[True, ~same]) - 1
        bad = np.zeros(int(run[-1]) + 1, dtype=bool)
        bad[run[1:][same & start[1:]]] = True
        sel = np.flatnonzero(bad[run])
        resort = np.lexsort((key[sel], hv[sel], run[sel]))
        perm[sel], key[sel], hv[sel] = perm[sel][resort], key[sel][resort], hv[sel][resort]
        np.not_equal(hv[1:], hv[:-1], out=start[1:])
    firsts = np.flatnonzero(start)
    _tick('start')
    rows = np.take(owners, perm)
    _tick('rows')
    level = (rows != np.repeat(np.minimum.reduceat(rows, firsts), np.diff(np.r_[firsts, size]))).view(np.uint8)
    _tick('seen')
    if tbits:
        target = key >> np.uint64(ibits)
        target &= np.uint64((1 << tbits) - 1)
        start[1:] |= target[1:] != target[:-1]
        # per (hash, target) group, the earliest finish rank among the earlier members: a running
        # maximum of group * big - rank; at a group's first block it is at least big (never a hit)
        big = len(r.done) + 2
        earliest = np.cumsum(start)
        earliest *= big
        run = np.maximum.accumulate(earliest - np.take(r.provide, rows))
        earliest[1:] -= run[:-1]
        _tick('reach')
        level += (earliest < np.take(r.done, rows)).view(np.uint8)
        level += (earliest < np.take(r.ready, rows)).view(np.uint8)
    _tick('ready')
    back = np.empty(size, dtype=np.uint8)
    back[perm] = level
    _tick('scatter')
    _first_below(r.leading, back if at is None else np.take(back, at), owner, pos)
    _tick('first_below')


def _leading(r: _Rows, values: np.ndarray, offsets: np.ndarray, replies: np.ndarray, provider: np.ndarray,
             chunk: int) -> None:
    """Fill ``r``'s leading offered (and, with targets, reachable and ready) blocks, part by part
    (:func:`_parts`): ``values`` and ``offsets`` the rows' prompt blocks, ``replies`` (indices into
    ``values``) and ``provider`` the reply blocks and the rows that computed them."""
    bits = _part_bits(len(values) + len(replies), chunk)
    for part, index, counts, reply in _parts(values, replies, offsets, bits):
        owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        _account_part(r, part, owner, index - np.take(offsets, owner), counts, np.take(values, replies[reply]),
                      provider[reply], bits)


def _replies(values: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, parent: np.ndarray,
             inp: np.ndarray, out: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(index in ``values``, providing row), by row, of the blocks a request computed beyond its prompt, its reply: a
    child whose prompt extends the parent's (equal hash at the parent's last full prompt block;
    hashes are chained) names them as its blocks from the parent's full prompt blocks up to the
    parent's prompt + reply less the last token (which is never in the KV cache), as the
    simulator's ``_cache_reply`` keeps them and a real engine caches the reply's KV."""
    child = np.flatnonzero(parent >= 0)
    p = parent[child]
    own = inp[p] // block
    upto = np.minimum((inp[p] + out[p] - 1) // block, lengths[child])
    last = own - 1
    extends = (own >= 1) & (own <= lengths[p]) & (upto > own)
    keep = np.flatnonzero(extends)
    extends[keep] = values[offsets[child[keep]] + last[keep]] == values[offsets[p[keep]] + last[keep]]
    child, p, own, upto = child[extends], p[extends], own[extends], upto[extends]
    count = upto - own
    at = np.repeat(offsets[child] + own - np.cumsum(np.r_[0, count[:-1]]), count) + np.arange(count.sum())
    provider = np.repeat(p, count)
    by_row = np.argsort(provider, kind="stable")
    return at[by_row], provider[by_row]


def _reordered(order: np.ndarray) -> np.ndarray:
    """The inverse of the permutation ``order``: where each row went."""
    back = np.empty(len(order), dtype=np.int64)
    back[order] = np.arange(len(order), dtype=np.int64)
    return back


def _arrival_order(rows: pa.Table, column: str) -> np.ndarray | None:
    """The rows' order by (``column``, request id), None where they are in it already: the per-block
    passes take the rows in arrival order (a block's row is then its arrival rank)."""
    order = _order_by(rows.column(column).fill_null(np.nan).to_numpy(), rows.column("request_id").to_numpy())
    return order if (order != np.arange(len(order))).any() else None


def offered_tokens(trace: pa.Table, block: int) -> np.ndarray:
    """Per trace row, the offered reuse in tokens (earlier = earlier ``arrival_s``, then request id):
    what one unbounded cache shared by every target would serve, before any engine's granularity."""
    inp = trace.column("input_tokens").to_numpy().astype(np.int64)
    if "prefix_hashes" not in trace.column_names:
        return np.zeros(len(inp), dtype=np.int64)
    hashes = keyed_prefix_hashes(trace)                             # no reuse across LoRA adapters
    order = _arrival_order(trace, "arrival_s")
    values, lengths, offsets = _lists(hashes if order is None else hashes.take(order))
    none = np.zeros(0, dtype=np.int64)
    r = _Rows(provide=none, done=none, ready=none, holder=none, targets=0, leading=(lengths,))
    _leading(r, values, offsets, none, none, CHUNK_BLOCKS)
    offered = lengths if order is None else lengths[_reordered(order)]
    cached: np.ndarray = np.minimum(offered * block, inp)
    return cached


def account(hashes: pa.Array | pa.ChunkedArray, parent: np.ndarray, block: int, rows: pa.Table,
            unit_of: Mapping[str, int], chunk_blocks: int = CHUNK_BLOCKS) -> pa.Table:
    """The per-request buckets (``CACHE_ACCOUNTING`` columns but ``run_id``) for ``rows`` (a
    requests table) whose trace rows' ``prefix_hashes`` are ``hashes`` and whose parents (a
    previous turn) are the rows ``parent`` (-1: none), both aligned with ``rows``. ``unit_of``:
    each target's engine KV block in tokens (targets not named: the trace block). The blocks are
    accounted in parts of about ``chunk_blocks`` (:func:`_parts`; the result is the same for any),
    the rows in arrival order (rows in another order are put in it, and their buckets back)."""
    order = _arrival_order(rows, "scheduled_s")
    if order is not None:
        back = _reordered(order)
        moved = parent[order]
        parent = np.where(moved >= 0, back[np.maximum(moved, 0)], -1)
        return account(hashes.take(order), parent, block, rows.take(order), unit_of, chunk_blocks).take(back)
    n = rows.num_rows
    ids = rows.column("request_id").to_numpy()
    # per row through the few distinct targets, in Arrow and NumPy (a Python walk per row cost a
    # quarter of the accounting): code = index in the sorted target names, -1 for none
    holder_names = pc.coalesce(rows.column("prefill_target"), rows.column("target")).combine_chunks().cast(pa.string())
    names = sorted(pc.unique(holder_names).drop_null().to_pylist())
    holder = pc.index_in(holder_names, value_set=pa.array(names, pa.string())).fill_null(-1).to_numpy(
        zero_copy_only=False).astype(np.int64)
    unit = np.array([max(block, unit_of.get(t, block)) for t in names] + [block], dtype=np.int64)[holder]
    ok = pc.equal(rows.column("status"), "ok").to_numpy(zero_copy_only=False)
    inp = rows.column("input_tokens").fill_null(0).to_numpy().astype(np.int64)
    sent = rows.column("sent_s").fill_null(np.nan).to_numpy()
    first = rows.column("first_token_s").fill_null(np.nan).to_numpy()
    cached_col = rows.column("cached_tokens")
    measured = cached_col.is_valid().to_numpy(zero_copy_only=False)
    cached = cached_col.fill_null(0).to_numpy().astype(np.int64)
    predicted = rows.column("predicted_cached_tokens").fill_null(0).to_numpy().astype(np.int64)
    out = rows.column("output_tokens").fill_null(0).to_numpy().astype(np.int64)
    # a reply that opens with reasoning shares nothing with the next turn, whose prompt keeps the
    # answer only (the simulator's _cache_reply says the same)
    out[rows.column("reasoning_tokens").fill_null(0).to_numpy() > 0] = 0

    values, lengths, offsets = _lists(hashes)
    # a request's own prompt blocks, then the reply blocks it provides to a next turn
    replies, provider = _replies(values, offsets, lengths, parent, inp, out, block)
    done = _ranks(first, ids)
    # prefills finished when each row was sent (finish times in rank order; none when sent is unknown)
    finished = np.searchsorted(np.sort(np.where(np.isnan(first), np.inf, first)), sent, side="right")
    reachable = np.where(holder >= 0, done, -1)
    r = _Rows(provide=np.where(np.isnan(first), n + 1, done), done=reachable,
              ready=np.minimum(reachable, np.where(np.isnan(sent), 0, finished)), holder=holder,
              targets=len(names), leading=(lengths.copy(), lengths.copy(), lengths.copy()))
    _leading(r, values, offsets, replies, provider, chunk_blocks)
    offered_blocks, reach_blocks, ready_blocks = r.leading

    def tokens(blocks: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.minimum(blocks * block, inp)
        return out

    def engine(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.maximum(np.minimum(x, inp - 1), 0) // unit * unit
        return out

    offered = tokens(offered_blocks)
    o2, r2, v2 = engine(offered), engine(tokens(reach_blocks)), engine(tokens(ready_blocks))
    zero = np.zeros(n, dtype=np.int64)
    good = ok & measured
    achieved = np.where(good, np.minimum(cached, r2), 0)
    in_flight = np.where(good, r2 - np.maximum(v2, achieved), 0)
    gone = np.where(good, np.maximum(v2, achieved) - achieved, 0)
    stale = np.minimum(gone, np.maximum(engine(predicted) - achieved, 0))
    cols = {
        "request_id": ids,
        "holder": holder_names,
        "unit_tokens": unit,
        "offered_tokens": offered,
        "reachable_tokens": np.where(ok, r2, zero),
        "achieved_tokens": achieved,
        "granularity_tokens": offered - o2,
        "failed_tokens": np.where(ok, zero, o2),
        "routing_tokens": np.where(ok, o2 - r2, zero),
        "in_flight_tokens": in_flight,
        "eviction_tokens": gone - stale,
        "stale_tokens": stale,
        "unmeasured_tokens": np.where(ok & ~measured, r2, zero),
        "beyond_tokens": np.where(good, cached - achieved, zero),
    }
    return pa.table({k: (v if isinstance(v, pa.Array) else pa.array(v, CACHE_ACCOUNTING.schema.field(k).type))
                     for k, v in cols.items()})


#: the requests columns the accounting reads (the token segments, most of the file, are skipped)
_ROWS = TableSpec(kind=REQUESTS.kind, version=REQUESTS.version,
                  schema=pa.schema([REQUESTS.schema.field(c) for c in _NEEDED]), required=frozenset({"request_id"}))


def _requests(path: Path) -> pa.Table:
    parts = []
    for f in table_files(path):
        pf = open_parquet(f, REQUESTS)
        parts.append(_ROWS.conform(pf.read(columns=[c for c in _NEEDED if c in pf.schema_arrow.names]), f))
    return pa.concat_tables(parts) if parts else _ROWS.empty()


def write_accounting(run_dir: Path, run_id: str, trace: pa.Table, unit_of: Mapping[str, int]) -> int:
    """Account run ``run_id`` (folder ``run_dir``) against ``trace`` and write its
    ``cache_accounting.parquet``; returns the rows written (0, and nothing written, when the trace
    has no prefix hashes or the run no rows)."""
    if "prefix_hashes" not in trace.column_names or not len(pc.list_flatten(trace.column("prefix_hashes"))):
        return 0
    _last[0] = _t.process_time()
    rows = _requests(run_dir / REQUESTS_FILE)
    _tick('read')
    if not rows.num_rows:
        return 0
    # the rows in arrival order before their hashes are taken (account would take them again)
    order = _arrival_order(rows, "scheduled_s")
    if order is not None:
        rows = rows.take(order)
    index = pc.index_in(rows.column("request_id"), value_set=trace.column("request_id").combine_chunks())
    _tick('order')
    hashes = keyed_prefix_hashes(trace).take(index)
    _tick('take')
    parent = np.full(rows.num_rows, -1, dtype=np.int64)
    if "parent_id" in trace.column_names:
        parent_id = trace.column("parent_id").combine_chunks().take(index)
        at = pc.index_in(parent_id, value_set=rows.column("request_id").combine_chunks())
        parent = at.fill_null(-1).to_numpy().astype(np.int64)
    block = trace_block_size(trace)
    table = account(hashes, parent, block, rows, unit_of)
    if order is not None:
        table = table.take(_reordered(order))
    _tick('post')
    table = table.add_column(0, "run_id", pa.array([run_id] * table.num_rows, pa.string()))
    schema = CACHE_ACCOUNTING.schema.with_metadata(CACHE_ACCOUNTING.metadata({META_BLOCK_SIZE: str(block).encode()}))
    table = CACHE_ACCOUNTING.conform(table, run_dir / ACCOUNTING_FILE).replace_schema_metadata(schema.metadata)
    replace_table(run_dir / ACCOUNTING_FILE, [table], schema, compression="zstd")
    _tick('write')
    rows_written: int = table.num_rows
    return rows_written


def keep_accounting(run: RunStore, trace: pa.Table, unit_of: Mapping[str, int]) -> None:
    """Write the run's cache accounting when its store closes (complete or partial).

    ``unit_of``: the KV block, in tokens, of each target that caches prefixes, read when the store
    closes (the simulator fills it from its summary); when it names none, no target caches and
    nothing is written."""
    def finalize(store: RunStore) -> None:
        if unit_of and write_accounting(store.dir, store.run_id, trace, unit_of):
            store.summary["prefix_cache"] = {"file": ACCOUNTING_FILE, "unit_tokens": dict(sorted(unit_of.items()))}
    run.finalizers.append(finalize)


#: per run: each bucket's share of the run's prompt tokens (docs/metrics.md, "Prefix-cache accounting")
_SUMMARY_SQL = """
SELECT a.run_id, sum(r.input_tokens)::BIGINT AS prompt_tokens,
       {sums}
FROM cache_accounting a JOIN requests r USING (run_id, request_id)
GROUP BY ALL ORDER BY a.run_id
"""

#: per run, over ok rows with a prediction: predicted against delivered cached tokens
_PREDICTED_SQL = """
SELECT run_id, count(*) AS requests, sum(input_tokens)::BIGINT AS prompt_tokens,
       sum(predicted_cached_tokens)::BIGINT AS predicted, sum(cached_tokens)::BIGINT AS delivered,
       sum(greatest(predicted_cached_tokens - cached_tokens, 0))::BIGINT AS over,
       sum(greatest(cached_tokens - predicted_cached_tokens, 0))::BIGINT AS under
FROM requests WHERE status = 'ok' AND predicted_cached_tokens IS NOT NULL AND cached_tokens IS NOT NULL
GROUP BY ALL ORDER BY run_id
"""

BUCKETS = ("offered", "reachable", "achieved", *LOSSES, "beyond")


def accounting_summary(cat: Catalog) -> dict[str, PrefixCacheFigures]:
    """``{run_id: {...}}`` for the runs that have a cache accounting: each bucket as a share of the
    run's prompt tokens (``<bucket>``) and in tokens (``tokens``), and the router's predicted hit
    rate against the delivered one where the policy predicted (``predicted``)."""
    sums = ",\n       ".join(f"sum(a.{b}_tokens)::BIGINT AS {b}" for b in BUCKETS)
    out: dict[str, PrefixCacheFigures] = {}
    for r in cat.query(_SUMMARY_SQL.format(sums=sums)).to_pylist():
        tokens = _tokens(r)
        out[r["run_id"]] = {**_shares(tokens), "tokens": tokens, "predicted": None}
    if out:
        for r in cat.query(_PREDICTED_SQL).to_pylist():
            if r["run_id"] in out and r["prompt_tokens"]:
                total = r["prompt_tokens"]
                out[r["run_id"]]["predicted"] = {
                    "requests": r["requests"], "hit_rate_predicted": r["predicted"] / total,
                    "hit_rate_delivered": r["delivered"] / total, "over": r["over"] / total,
                    "under": r["under"] / total}
    return out


def _tokens(r: ArrowRow) -> CacheTokens:
    """A row of ``_SUMMARY_SQL`` as the run's prompt tokens and each bucket's (:data:`BUCKETS`) tokens."""
    return {"prompt": r["prompt_tokens"] or 0, "offered": r["offered"], "reachable": r["reachable"],
            "achieved": r["achieved"], "granularity": r["granularity"], "failed": r["failed"],
            "routing": r["routing"], "in_flight": r["in_flight"], "eviction": r["eviction"], "stale": r["stale"],
            "unmeasured": r["unmeasured"], "beyond": r["beyond"]}


def _shares(t: CacheTokens) -> CacheBuckets:
    """Each bucket as a share of the run's prompt tokens (None: no prompt tokens)."""
    total = t["prompt"]

    def share(n: int | None) -> float | None:
        return n / total if total and n is not None else None

    return {"offered": share(t["offered"]), "reachable": share(t["reachable"]), "achieved": share(t["achieved"]),
            "granularity": share(t["granularity"]), "failed": share(t["failed"]), "routing": share(t["routing"]),
            "in_flight": share(t["in_flight"]), "eviction": share(t["eviction"]), "stale": share(t["stale"]),
            "unmeasured": share(t["unmeasured"]), "beyond": share(t["beyond"])}
