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
rewrite of its token segments); and the work is vectorised over the trace's flattened hashes (per part
one sort of a 64-bit key per block packing its hash's bits over its name: see :class:`_Slots`), not a
Python walk per block (docs/prefix-cache.md has the measured cost). Every bucket compares a block only
with blocks of the same hash, so the blocks are accounted in parts by hash (:func:`_parts`) of at most
about :data:`CHUNK_BLOCKS`: the working memory is that of one part (and, in C, a group's lists),
whatever the run's length, and the result the same as in one. With the compiled core, the passes that
select a part's blocks and read its sorted keys run in C (``cache_kernels.c``: :func:`_native_keys`,
:func:`_account_piece`); the NumPy passes are the reference, and the tests compare the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.hugepages import small_pages
from llmlb_bench.metrics import kernels
from llmlb_bench.metrics.run_figures import CacheBuckets, CacheTokens, PrefixCacheFigures
from llmlb_bench.schema import ArrowRow, CACHE_ACCOUNTING, META_BLOCK_SIZE, REQUESTS, TableSpec, open_parquet, trace_block_size
from llmlb_bench.store.parts import replace_table, table_files
from llmlb_bench.store.run import ACCOUNTING_FILE, REQUESTS_FILE
from llmlb_bench.trace_columns import keyed_prefix_hashes

if TYPE_CHECKING:
    from types import ModuleType

    from llmlb_bench.store import RunStore
    from llmlb_bench.store.views import Catalog

#: the C pass over a piece (``cache_kernels.c``, built with the compiled core: ``compiled_core.KERNELS``),
#: or None: :func:`_account_piece`'s NumPy code runs (the reference; read at each call, so a test sets it
#: to None)
native: ModuleType | None = kernels.load("cache_kernels")

#: the loss buckets, in the order of the identity above (all but achieved)
LOSSES = ("granularity", "failed", "routing", "in_flight", "eviction", "stale", "unmeasured")

_NEEDED = ["request_id", "target", "prefill_target", "status", "scheduled_s", "sent_s", "first_token_s",
           "input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens", "predicted_cached_tokens"]


def _ranks(primary: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rank of each row by (``primary``, request id, place); NaN sorts last. Vectorised sorts of
    one key each: where times are equal (a prefill step's requests finish together; NaNs), by one
    integer packing the time's rank over the id's (a two-key ``lexsort`` cost several times as much)."""
    key = np.where(np.isnan(primary), np.inf, primary)
    order = np.argsort(key)
    ordered = key[order]
    steps = ordered[1:] != ordered[:-1]
    if not steps.all():
        n = len(key)
        by_time = np.empty(n, dtype=np.int64)
        by_time[order] = np.r_[0, np.cumsum(steps)]
        order = np.argsort(by_time * n + _reordered(np.argsort(ids, kind="stable")))
    return _reordered(order)


def _reordered(order: np.ndarray) -> np.ndarray:
    """The inverse of the permutation ``order``: where each row went."""
    back = np.empty(len(order), dtype=np.int64)
    back[order] = np.arange(len(order), dtype=np.int64)
    return back


def _lists(hashes: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list column of hashes as (values, row lengths, offsets); the values without a copy where
    the column is one chunk (null lists have no values)."""
    lengths = pc.list_value_length(hashes).fill_null(0).to_numpy().astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.asarray(pc.list_flatten(hashes).to_numpy(), dtype=np.uint64)
    return values, lengths, offsets


#: blocks accounted at once: the working arrays (one word per block, and where there are several parts
#: a word per block of the part for its index) grow with this, not with the run; a run of up to this
#: many blocks is one part (selecting the parts is a pass over every block
#: per part: at 2^20 the 30,000-request shared-prefix run took 0.25 CPU-s, at 2^22 0.23)
CHUNK_BLOCKS = 1 << 22

#: sorted blocks taken at once by the passes after a part's sort: their arrays (a few hundred KB)
#: stay in the processor's cache between passes, which on this machine makes those passes about
#: 1.6x cheaper than over the whole part
PIECE_BLOCKS = 1 << 16

#: how many parts the C passes list in one pass over every block's part (:func:`_native_keys`; a pass per
#: part read them once per part: at a million requests 64 times 153 MB); the group's lists take twelve
#: bytes a block (its place and its hash), up to this many times :data:`CHUNK_BLOCKS` of them (16: 805 MB
#: at most, 460 MB at a million requests; 8 cost 0.2-0.4 CPU-s more there, docs/prefix-cache.md)
GROUP_PARTS = 16

#: the C passes name a block by its place in 32 bits: a run with more blocks takes the NumPy passes
NATIVE_BLOCKS = 1 << 32

#: an odd multiplier (2^64 / golden ratio): multiplying by it permutes the 64-bit words and spreads
#: hashes that differ only in their low bits (small integers) over the high ones
_SPREAD = np.uint64(0x9E3779B97F4A7C15)


def _part_bits(blocks: int, chunk: int) -> int:
    """How many top bits of the spread hash name a block's part (:func:`_parts`): parts of about ``chunk``."""
    return max(0, math.ceil(math.log2(max(blocks, 1) / chunk)))


def _parts(values: np.ndarray, replies: np.ndarray, offsets: np.ndarray, bits: int
           ) -> Iterator[tuple[np.ndarray | None, np.ndarray, np.ndarray | None]]:
    """The blocks in ``2^bits`` parts by hash: per part ``(index, counts, reply)``, its prompt
    blocks' indices in ``values`` (ascending), how many of them each row has, and the indices in
    ``replies`` (indices into ``values`` of the reply blocks) of its reply blocks; ``None`` for
    every block in order (one part: no index arrays).

    Every bucket compares a block only with blocks of the same hash, so a part that holds whole
    hash groups is accounted on its own, and the result does not depend on how many parts there
    are (tested against one part): the run's length sets how many parts, not how large each is.
    A part is the top bits of the spread hash; beyond the trace, what every part needs is one
    byte per block (its part) and the rows' own arrays."""
    if not bits:
        yield None, np.diff(offsets), None
        return
    part = np.empty(len(values), dtype=np.uint8 if bits <= 8 else np.uint16)
    chunk = 1 << 20
    for a in range(0, len(values), chunk):
        part[a:a + chunk] = (values[a:a + chunk] * _SPREAD) >> np.uint64(64 - bits)
    reply_part = part[replies]
    for k in range(1 << bits):
        index = np.flatnonzero(part == k)
        # each row's first block in the part: a search per row, not per block
        yield index, np.diff(np.searchsorted(index, offsets)), np.flatnonzero(reply_part == k)


@dataclass
class _Slots:
    """The rows in (holder, arrival) order, a row's *slot* its place in that order, and what the
    per-block passes read per slot. A block is named by its row's slot and its place in the row
    (``pos``: its prompt blocks first, then the reply blocks it provides), packed as
    ``slot << pos_bits | pos`` in the low ``low_bits`` bits of its sort key, under its spread
    hash: one sort gives the (hash, target, arrival) order and keeps each block's name, so nothing
    is gathered through a permutation and nothing is scattered back. A block is reachable when the
    earliest prefill finish rank among the earlier arrivals on its target that computed it is
    below its row's ``done``, and ready when also below ``ready``."""

    row: np.ndarray         # the row at each slot
    arrival: np.ndarray     # per slot: the row's arrival rank
    #: per slot, with ``target`` = (index of the row's target in the sorted names + 1) * big (0 for none;
    #: big above every rank) and the ranks of :func:`_slots`: target - provide, target - done, target - ready
    give: np.ndarray
    reach_needs: np.ndarray
    ready_needs: np.ndarray
    stride: int             # (targets + 1) * big: a hash group's share of the (hash, target) groups' numbers
    #: whether the key's hash bits times ``stride`` (the groups' numbers) fit in 63 bits
    wide: bool
    targets: int            # how many names (0: offered alone, no per-target pass)
    prompt_base: np.ndarray  # per row: slot << pos_bits less the row's offset (+ a prompt block's index: its name)
    reply_base: np.ndarray   # per row: the same for its reply blocks (+ a reply block's index in the replies)
    lengths: np.ndarray     # per row: prompt blocks
    pos_bits: int
    low_bits: int
    #: the levels a block can be below (1: offered; 3: offered, reachable on its target, and reachable
    #: and computed before it was sent), and, per slot and level, the first position in the row of a
    #: block at that level (``slot * levels + level``; the row's prompt blocks where there is none: a
    #: reply block's position is never below them, so it changes nothing)
    levels: int
    lowest: np.ndarray
    #: the C pass's: per slot, one cache line: give, ready_needs, reach_needs, arrival, then ``lowest`` per
    #: level (put back by :meth:`leading`)
    table: np.ndarray | None = None

    def leading(self) -> tuple[np.ndarray, ...]:
        """Per row and level k, its leading blocks at level k or above: its first block below k."""
        if self.table is not None:
            self.lowest[:] = self.table[:, 4:4 + self.levels].reshape(-1)
        below = np.minimum.accumulate(self.lowest.reshape(-1, self.levels), axis=1)
        out = []
        for k in range(self.levels):
            lead = np.empty(len(self.row), dtype=np.int64)
            lead[self.row] = below[:, k]
            out.append(lead)
        return tuple(out)


def _lines(n: int) -> np.ndarray:
    """An (n, 8) int64 array whose rows start at 64-byte boundaries: a row is one cache line."""
    room = np.empty(8 * n + 8, dtype=np.int64)
    at = (-room.ctypes.data % 64) // 8
    return room[at:at + 8 * n].reshape(n, 8)


def _slots(arrival: np.ndarray, holder: np.ndarray, provide: np.ndarray, done: np.ndarray, ready: np.ndarray,
           targets: int, lengths: np.ndarray, offsets: np.ndarray, provider: np.ndarray, levels: int) -> _Slots:
    """The per-slot tables of rows given per row (any order): ``arrival`` rank, ``holder`` (index of
    the target, -1 for none), ``provide``, ``done`` and ``ready`` ranks (:class:`_Slots`), ``lengths``
    and ``offsets`` of their prompt blocks; ``provider`` the rows of the reply blocks (non-decreasing);
    ``levels``: 1 for offered alone, else 3."""
    n = len(arrival)
    row = np.argsort((holder + 1) * n + arrival)             # arrival ranks are distinct: one key
    slot = _reordered(row)
    replies = np.bincount(provider, minlength=n)
    rstart = np.cumsum(replies) - replies
    pos_bits = max(int((lengths + replies).max(initial=0)).bit_length(), 1)
    low_bits = max(n - 1, 0).bit_length() + pos_bits
    if low_bits > 56:
        raise ValueError(f"cache accounting: {n:,} requests of up to {1 << pos_bits:,} blocks are more than its "
                         "64-bit sort key can name")
    big = n + 2                                                # above every finish rank (provide <= n + 1)
    target = (holder[row] + 1) * big
    return _Slots(row=row, arrival=arrival[row], give=target - provide[row], reach_needs=target - done[row],
                  ready_needs=target - ready[row], stride=(targets + 1) * big, targets=targets,
                  wide=((targets + 1) * big).bit_length() + 64 - low_bits <= 63,
                  prompt_base=(slot << pos_bits) - offsets[:-1], reply_base=(slot << pos_bits) + lengths - rstart,
                  lengths=lengths, pos_bits=pos_bits, low_bits=low_bits, levels=levels,
                  lowest=np.repeat(lengths[row], levels))


class _Work:
    """The arrays of a part (its sort keys, its prompt blocks' spread hashes, and in C its group's
    lists of blocks and their hashes), reused by every part: fresh memory costs a page fault per 4 KB
    the first time it is written."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def take(self, name: str, size: int, dtype: type[np.unsignedinteger] = np.uint64) -> np.ndarray:
        """Array ``name`` of ``size`` (room for a quarter more once a later part is larger)."""
        held = self.arrays.get(name)
        if held is None or len(held) < size:
            room = size + size // 4 if held is not None else size
            self.arrays[name] = np.zeros(0, dtype=dtype)       # the smaller one freed first
            held = self.arrays[name] = np.empty(room, dtype=dtype)
        return held[:size]


def _numpy_keys(s: _Slots, values: np.ndarray, offsets: np.ndarray, replies: np.ndarray, provider: np.ndarray,
                bits: int, piece: int, work: _Work) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per part (:func:`_parts`), its sort keys (prompt blocks first, then reply blocks: :func:`_keys`)
    and its prompt blocks' spread hashes less the ``bits`` that name the part (:func:`_spread`), in
    the arrays of ``work``; the reference of :func:`_native_keys`."""
    high = np.uint64(((1 << 64) - 1) ^ ((1 << s.low_bits) - 1))
    for index, counts, reply in _parts(values, replies, offsets, bits):
        prompts = len(values) if index is None else len(index)
        more = len(replies) if reply is None else len(reply)
        key, spread = work.take("key", prompts + more), work.take("spread", prompts)
        _spread(values, index, 0, prompts, bits, spread)
        _keys(s, values, index, counts, bits, high, piece, key[:prompts])
        if more:
            at = replies if reply is None else replies[reply]
            rkey = key[prompts:]
            np.take(values, at, out=rkey, mode="clip")
            rkey *= _SPREAD
            if bits:
                rkey <<= np.uint64(bits)
            rkey &= high
            name = np.take(s.reply_base, provider if reply is None else provider[reply])
            name += np.arange(more) if reply is None else reply
            rkey |= name.view(np.uint64)
        yield key, spread


def _native_keys(s: _Slots, values: np.ndarray, offsets: np.ndarray, replies: np.ndarray, provider: np.ndarray,
                 bits: int, work: _Work, kernel: ModuleType) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """What :func:`_numpy_keys` yields, by ``cache_kernels.c``: each block's part and the parts' sizes
    in one pass; per group of :data:`GROUP_PARTS` parts, one pass over the blocks' parts that lists the
    group's blocks by part with their hashes (a counting sort); then per part, one pass over its list
    that writes its blocks' keys and spread hashes (no per-row counts: the rows are walked along; the
    hashes read in order, not through the blocks' places: a cache line each). The spread hashes come
    without most repeats (each distinct one at least once: all the collision check of
    :func:`_shared_fields` needs), a sixth of them at a million shared-prefix requests."""
    # per side, its blocks' hashes, the rows' offsets among them and the rows' name bases; the reply
    # blocks' hashes gathered once
    sides = {"prompt": (values, offsets, s.prompt_base),
             "reply": (np.take(values, replies), np.searchsorted(provider, np.arange(len(s.row) + 1)), s.reply_base)}

    def write(side: str, index: np.ndarray | None, hashes: np.ndarray, spread: np.ndarray | None,
              key: np.ndarray) -> int:
        return int(kernel.select(index, hashes, *sides[side][1:], bits, s.low_bits, spread, key)) if len(key) else 0

    if not bits:
        key, spread = work.take("key", len(values) + len(replies)), work.take("spread", len(values))
        distinct = write("prompt", None, values, spread, key[:len(values)])
        write("reply", None, sides["reply"][0], None, key[len(values):])
        yield key, spread[:distinct]
        return
    wide = bits > 8
    part_of, sizes = {}, {}
    for name, (items, _, _) in sides.items():
        part_of[name] = np.empty(len(items), dtype=np.uint16 if wide else np.uint8)
        sizes[name] = np.empty(1 << bits, dtype=np.int64)
        kernel.parts(items, bits, part_of[name], sizes[name])
    # the arrays taken once at the largest group's and part's sizes: a larger one later would take
    # fresh memory (at a million requests 100,000 more page faults a call)
    for name, size in sizes.items():
        largest = int(np.add.reduceat(size, np.arange(0, len(size), GROUP_PARTS)).max())
        work.take(name, largest, np.uint32)
        work.take(name + " hashes", largest)
    work.take("key", int((sizes["prompt"] + sizes["reply"]).max()))
    work.take("spread", int(sizes["prompt"].max()))
    for k0 in range(0, 1 << bits, GROUP_PARTS):
        lists = {}
        for name, (items, _, _) in sides.items():
            starts = np.r_[0, np.cumsum(sizes[name][k0:k0 + GROUP_PARTS])]
            index, hashes = work.take(name, int(starts[-1]), np.uint32), work.take(name + " hashes", int(starts[-1]))
            kernel.spill(part_of[name], items, k0, starts, index, hashes, wide)
            lists[name] = (index, hashes, starts.tolist())
        (p_index, p_hashes, p_at), (r_index, r_hashes, r_at) = lists["prompt"], lists["reply"]
        for j in range(len(p_at) - 1):
            p0, p1, r0, r1 = p_at[j], p_at[j + 1], r_at[j], r_at[j + 1]
            key, spread = work.take("key", p1 - p0 + r1 - r0), work.take("spread", p1 - p0)
            distinct = write("prompt", p_index[p0:p1], p_hashes[p0:p1], spread, key[:p1 - p0])
            write("reply", r_index[r0:r1], r_hashes[r0:r1], None, key[p1 - p0:])
            yield key, spread[:distinct]


def _account_part(s: _Slots, key: np.ndarray, spread: np.ndarray, values: np.ndarray, replies: np.ndarray,
                  piece: int, whole: bool) -> None:
    """Lower ``s.lowest`` by one part (:func:`_parts`): its blocks' sort ``key`` (prompt blocks
    first) and its prompt blocks' ``spread`` hashes (less the bits that name the part; each distinct
    one at least once, in any order).

    One vectorised sort of a 64-bit word per block packing (the spread hash's next bits, the
    block's name: :class:`_Slots`) puts the blocks in (hash, target, arrival) order; the rare
    hashes that share those bits with another are put in order by value (:func:`_split_shared`),
    found by sorting the spread hashes (a reply block's hash is a prompt block's). The sorted words
    are read in pieces of about ``piece`` blocks whose arrays stay in the processor's cache
    (:func:`_account_piece`), or, ``whole``, at once (the C pass keeps nothing but the words)."""
    size, low = len(key), s.low_bits
    if not size:
        return
    shared = _shared_fields(spread, low, piece)
    key.sort()
    splits = _split_shared(s, key, shared, values, replies) if len(shared) else np.zeros(0, dtype=np.int64)
    if whole:
        _account_piece(s, key, splits)
        return
    # pieces end where a hash starts: the first key of the field at every piece-th word
    ends = np.searchsorted(key, key[piece::piece] >> np.uint64(low) << np.uint64(low))
    ends = np.unique(np.r_[ends[ends > 0], size])
    a = 0
    for b in ends.tolist():
        _account_piece(s, key[a:b], splits[(splits >= a) & (splits < b)] - a)
        a = b


def _spread(values: np.ndarray, index: np.ndarray | None, a: int, b: int, bits: int, out: np.ndarray) -> None:
    """Into ``out``: the spread hashes of a part's prompt blocks ``a`` to ``b`` (``index`` into
    ``values``; ``None``: all), less the ``bits`` that name the part."""
    if index is None:
        np.multiply(values[a:b], _SPREAD, out=out)
    else:
        np.take(values, index[a:b], out=out, mode="clip")     # "clip": "raise" buffers the take
        out *= _SPREAD
    if bits:
        out <<= np.uint64(bits)


def _keys(s: _Slots, values: np.ndarray, index: np.ndarray | None, counts: np.ndarray, bits: int, high: np.uint64,
          piece: int, key: np.ndarray) -> None:
    """Fill a part's prompt blocks' sort ``key`` (the spread hash's bits under ``high``, below them
    the block's name), rows of about ``piece`` blocks at a time: each piece's temporaries stay in
    the processor's cache."""
    ends = np.cumsum(counts)
    cuts = np.unique(np.r_[np.searchsorted(ends, np.arange(piece, len(key), piece)), len(counts)])
    r0, a = 0, 0
    for r1 in cuts.tolist():
        b = int(ends[r1 - 1]) if r1 else 0
        if b > a:
            k = key[a:b]
            _spread(values, index, a, b, bits, k)
            k &= high
            name = np.repeat(s.prompt_base[r0:r1], counts[r0:r1])
            name += np.arange(a, b) if index is None else index[a:b]
            k |= name.view(np.uint64)
        r0, a = r1, b


def _shared_fields(spread: np.ndarray, low: int, piece: int) -> np.ndarray:
    """The key bits (the spread hash above its ``low`` bits) that distinct hashes share: neighbours
    in value order that differ below them. Sorts ``spread`` in place; a reply block's hash is a
    prompt block's, so the prompt blocks are all it needs, and each distinct hash once is enough."""
    spread.sort()
    near = np.uint64((1 << low) - 1)
    found = []
    for a in range(0, len(spread) - 1, piece):
        b = min(a + piece, len(spread) - 1)
        x = np.bitwise_xor(spread[a + 1:b + 1], spread[a:b])
        x -= np.uint64(1)                                      # equal hashes wrap to the top: not near
        hit = np.flatnonzero(x < near)
        if len(hit):
            found.append(spread[a + 1 + hit] >> np.uint64(low))
    return np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.uint64)


def _split_shared(s: _Slots, key: np.ndarray, shared: np.ndarray, values: np.ndarray, replies: np.ndarray
                  ) -> np.ndarray:
    """Within each run of sorted ``key`` whose hash bits are one of ``shared`` (distinct hashes
    that share them), put the blocks in (hash, name) order, reading each block's hash back from
    its name; returns where a hash starts inside such runs (positions in ``key``)."""
    splits = []
    for field in shared.tolist():
        a = int(np.searchsorted(key, np.uint64(field << s.low_bits)))
        b = int(np.searchsorted(key, np.uint64((field + 1 << s.low_bits) - 1), side="right"))
        run = key[a:b]
        name = (run & np.uint64((1 << s.low_bits) - 1)).view(np.int64)
        row = s.row[name >> s.pos_bits]
        at = name - s.prompt_base[row]                         # a prompt block's index in values
        reply = (name & ((1 << s.pos_bits) - 1)) >= s.lengths[row]
        at[reply] = replies[name[reply] - s.reply_base[row[reply]]]
        hashes = values[at]
        order = np.lexsort((run, hashes))
        key[a:b], hashes = run[order], hashes[order]
        splits.append(a + 1 + np.flatnonzero(hashes[1:] != hashes[:-1]))
    return np.concatenate(splits)


def _account_piece(s: _Slots, key: np.ndarray, splits: np.ndarray) -> None:
    """Lower ``s.lowest`` by a run of sorted keys that holds whole hashes (``splits``: where a hash
    starts that shares its key bits with the one before).

    A block is at one of ``s.levels`` levels (offered, reachable, ready: each implies the one
    before), and only the blocks below the top level move a row's leading counts. Per (hash,
    target) group in arrival order, the earliest prefill finish among the earlier members says
    whether a block was reachable and ready: a running maximum over every block of ``group number -
    finish rank``, where a hash's number is its key bits times ``s.stride`` (no cumulative sum over
    the blocks) unless that overflows 63 bits or the piece holds hashes that share their key bits
    (then it is the hash's number in the piece, a cumulative sum). The rest is read only for the
    blocks that are not ready (a third of them on the 30,000-request ``shared-prefix`` run under
    ``least_outstanding``): whether reachable, and whether offered, i.e. its row arrived after the
    hash's earliest, whose block is never ready (nothing arrived before it), so the hash's earliest
    arrival is a minimum over these blocks alone; per slot and level, the first position of a block
    at that level is a scatter-minimum."""
    kernel = native
    if kernel is not None and bool(s.targets) == (s.levels == 3):
        if s.table is None:
            s.table = _lines(len(s.row))
            s.table[:, :4] = np.stack([s.give, s.ready_needs, s.reach_needs, s.arrival], axis=1)
            s.table[:, 4:4 + s.levels] = s.lowest.reshape(-1, s.levels)
        kernel.piece(key.view(np.int64), np.ascontiguousarray(splits, dtype=np.int64), s.table, s.low_bits,
                     s.pos_bits, s.levels, s.stride, int(bool(len(splits)) or not s.wide), s.targets)
        return
    size = len(key)
    field = key >> np.uint64(s.low_bits)
    key &= np.uint64((1 << s.low_bits) - 1)
    name = key.view(np.int64)                                  # the sorted blocks' names, in place of the keys
    slot = name >> s.pos_bits
    number = field.view(np.int64)
    if len(splits) or not s.wide:
        # the hash's number in the piece, from 1 (summed in 32 bits: a cumulative sum into 64 bits costs
        # three times as much)
        start = np.empty(size, dtype=bool)                     # a block whose hash differs from the one before
        start[0] = True
        np.not_equal(field[1:], field[:-1], out=start[1:])
        start[splits] = True
        number = np.cumsum(start, dtype=np.int32).astype(np.int64)
    if not s.targets:
        offered = _later(number, np.take(s.arrival, slot))
        miss = np.flatnonzero(~offered)
        np.minimum.at(s.lowest, slot[miss], name[miss] & ((1 << s.pos_bits) - 1))
        return
    # per (hash, target) group, numbered G = hash number * stride + target (growing along the keys),
    # the earliest finish rank among the earlier members: before a block, the running maximum of
    # G - rank is G - earliest where the group has earlier members (at most G - big where not);
    # less the hash's number, it is compared with the block's target - done (reachable when below)
    # and target - ready (ready when below)
    number *= s.stride
    run = np.take(s.give, slot)
    run += number
    np.maximum.accumulate(run, out=run)
    before = np.empty(size, dtype=np.int64)
    before[0] = -1 << 62                                       # no earlier block: neither
    np.subtract(run[:-1], number[1:], out=before[1:])
    miss = np.flatnonzero(np.take(s.ready_needs, slot) >= before)
    named = np.take(name, miss)
    below = named >> s.pos_bits                                # their slots
    level = (np.take(s.reach_needs, below) < np.take(before, miss)).view(np.uint8)
    level += _later(np.take(number, miss), np.take(s.arrival, below)).view(np.uint8)
    below *= s.levels
    below += level
    named &= (1 << s.pos_bits) - 1                             # their places in the row
    np.minimum.at(s.lowest, below, named)


#: above every arrival rank
_LATEST = np.iinfo(np.int64).max


def _later(number: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    """Per block of sorted runs of equal ``number`` (a hash each), whether its ``arrival`` is later
    than the run's earliest (offered): a scatter-minimum by the run's number in the piece (summed in 32
    bits: a cumulative sum into 64 bits costs three times as much; read as 64-bit indices: NumPy
    converts 32-bit ones on every take)."""
    start = np.empty(len(number), dtype=bool)
    start[0] = True
    np.not_equal(number[1:], number[:-1], out=start[1:])
    group = np.cumsum(start, dtype=np.int32).astype(np.int64)
    first = np.full(int(group[-1]) + 1, _LATEST, dtype=np.int64)
    np.minimum.at(first, group, arrival)
    later: np.ndarray = arrival != np.take(first, group)
    return later


def _leading(s: _Slots, values: np.ndarray, offsets: np.ndarray, replies: np.ndarray, provider: np.ndarray,
             chunk: int) -> tuple[np.ndarray, ...]:
    """Per row, its leading offered (and, with targets, reachable and ready) blocks, part by part
    (:func:`_parts`): ``values`` and ``offsets`` the rows' prompt blocks, ``replies`` (indices into
    ``values``) and ``provider`` the reply blocks and the rows that computed them."""
    bits, work, piece = _part_bits(len(values) + len(replies), chunk), _Work(), min(chunk, PIECE_BLOCKS)
    kernel = native if len(values) < NATIVE_BLOCKS else None
    parts = _numpy_keys(s, values, offsets, replies, provider, bits, piece, work) if kernel is None else \
        _native_keys(s, values, offsets, replies, provider, bits, work, kernel)
    for key, spread in parts:
        _account_part(s, key, spread, values, replies, piece, kernel is not None)
    return s.leading()


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
    by_row = np.flatnonzero(extends)
    by_row = by_row[np.argsort(p[by_row], kind="stable")]     # per child, not per block: by providing row
    child, p, own, upto = child[by_row], p[by_row], own[by_row], upto[by_row]
    count = upto - own
    # each child's run of places, consecutive from its first: steps of one, and at a run's start the
    # step from the last run's end, summed in place (one array of the replies' length, not four)
    runs = np.flatnonzero(count)
    at = np.ones(int(count.sum()), dtype=np.int64)
    if len(runs):
        first, length = offsets[child[runs]] + own[runs], count[runs]
        start = np.cumsum(length) - length
        at[start[0]] = first[0]
        at[start[1:]] = first[1:] - (first[:-1] + length[:-1] - 1)
        np.cumsum(at, out=at)
    return at, np.repeat(p, count)


def _times(column: pa.ChunkedArray) -> np.ndarray:
    """A time column as floats, NaN for null."""
    times: np.ndarray = column.fill_null(np.nan).to_numpy()
    return times


def offered_tokens(trace: pa.Table, block: int) -> np.ndarray:
    """Per trace row, the offered reuse in tokens (earlier = earlier ``arrival_s``, then request id):
    what one unbounded cache shared by every target would serve, before any engine's granularity."""
    inp = trace.column("input_tokens").to_numpy().astype(np.int64)
    if "prefix_hashes" not in trace.column_names:
        return np.zeros(len(inp), dtype=np.int64)
    values, lengths, offsets = _lists(keyed_prefix_hashes(trace))  # no reuse across LoRA adapters
    n, none = len(lengths), np.zeros(0, dtype=np.int64)
    arrival = _ranks(_times(trace.column("arrival_s")), trace.column("request_id").to_numpy())
    unused = np.zeros(n, dtype=np.int64)
    s = _slots(arrival, np.full(n, -1, dtype=np.int64), unused, unused, unused, 0, lengths, offsets, none, 1)
    offered, = _leading(s, values, offsets, none, none, CHUNK_BLOCKS)
    cached: np.ndarray = np.minimum(offered * block, inp)
    return cached


def account(hashes: pa.Array | pa.ChunkedArray, parent: np.ndarray, block: int, rows: pa.Table,
            unit_of: Mapping[str, int], chunk_blocks: int = CHUNK_BLOCKS, order: np.ndarray | None = None) -> pa.Table:
    """The per-request buckets (``CACHE_ACCOUNTING`` columns but ``run_id``) for ``rows`` (a
    requests table, in any order) whose trace rows' ``prefix_hashes`` are ``hashes`` and whose
    parents (a previous turn) are the rows ``parent`` (-1: none), both aligned with ``rows``; or,
    with ``order`` (a permutation: row ``i`` of ``rows`` is row ``order[i]`` of ``hashes``), both
    aligned with the trace (``hashes`` read in place, the rows' own figures put in its order and
    the result back in theirs: cheaper than reordering the tables).
    ``unit_of``: each target's engine KV block in tokens (targets not named: the trace block). The
    blocks are accounted in parts of about ``chunk_blocks`` (:func:`_parts`; the result is the
    same for any)."""
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
    sent = _times(rows.column("sent_s"))
    first = _times(rows.column("first_token_s"))
    cached_col = rows.column("cached_tokens")
    measured = cached_col.is_valid().to_numpy(zero_copy_only=False)
    cached = cached_col.fill_null(0).to_numpy().astype(np.int64)
    predicted = rows.column("predicted_cached_tokens").fill_null(0).to_numpy().astype(np.int64)
    out = rows.column("output_tokens").fill_null(0).to_numpy().astype(np.int64)
    # a reply that opens with reasoning shares nothing with the next turn, whose prompt keeps the
    # answer only (the simulator's _cache_reply says the same)
    out[rows.column("reasoning_tokens").fill_null(0).to_numpy() > 0] = 0

    # what the blocks' pass reads per row, in the hashes' order (the ranks are cheaper there too: the
    # trace is in arrival order)
    per_row = [_times(rows.column("scheduled_s")), sent, first, ids, holder, inp, out]
    if order is not None:
        back = _reordered(order)
        per_row = [np.take(x, back) for x in per_row]
    scheduled, sent_at, first_at, id_at, holds, inputs, outputs = per_row
    done = _ranks(first_at, id_at)
    # prefills finished when each row was sent (finish times in rank order; none when sent is unknown)
    # (the sent times searched in their order: each search starts where the last one ended)
    finished = np.empty(n, dtype=np.int64)
    by_sent = np.argsort(sent_at)
    finished[by_sent] = np.searchsorted(np.sort(np.where(np.isnan(first_at), np.inf, first_at)), sent_at[by_sent],
                                        side="right")
    reachable = np.where(holds >= 0, done, -1)

    values, lengths, offsets = _lists(hashes)
    # a request's own prompt blocks, then the reply blocks it provides to a next turn
    replies, provider = _replies(values, offsets, lengths, parent, inputs, outputs, block)
    s = _slots(_ranks(scheduled, id_at), holds, np.where(np.isnan(first_at), n + 1, done), reachable,
               np.minimum(reachable, np.where(np.isnan(sent_at), 0, finished)), len(names), lengths, offsets, provider, 3)
    offered_blocks, reach_blocks, ready_blocks = _leading(s, values, offsets, replies, provider, chunk_blocks)
    if order is not None:
        offered_blocks, reach_blocks, ready_blocks = (np.take(x, order) for x in (offered_blocks, reach_blocks,
                                                                                   ready_blocks))

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




#: how the table is written: the integer columns delta-encoded, dictionaries for the two string columns
#: only and statistics for the two key columns (the integers' dictionaries and statistics were a third of
#: the write's CPU; the same table is read back)
_ENCODING = {f.name: "DELTA_BINARY_PACKED" for f in CACHE_ACCOUNTING.schema if pa.types.is_integer(f.type)}

#: the requests columns the accounting reads (the token segments, most of the file, are skipped)
_ROWS = TableSpec(kind=REQUESTS.kind, version=REQUESTS.version,
                  schema=pa.schema([REQUESTS.schema.field(c) for c in _NEEDED]), required=frozenset({"request_id"}))


def _requests(path: Path) -> pa.Table:
    parts = []
    for f in table_files(path):
        pf = open_parquet(f, REQUESTS)
        names = set(pf.schema_arrow.names)                     # (the property builds the schema anew each time)
        # one thread: the reader's pool spends more CPU than it saves on these few columns
        parts.append(_ROWS.conform(pf.read(columns=[c for c in _NEEDED if c in names], use_threads=False), f))
    return pa.concat_tables(parts) if parts else _ROWS.empty()


def _index_in(values: pa.Array | pa.ChunkedArray, keys: pa.Array) -> np.ndarray:
    """Where each of ``values`` is in ``keys`` (-1: absent or null), as ``pc.index_in``; by a
    subtraction where the keys are consecutive integers in order (a trace's request ids usually
    are: no hash table of them to build)."""
    at = np.asarray(keys.to_numpy(zero_copy_only=False))
    if len(at) and at.dtype.kind in "iu" and pa.types.is_integer(values.type) and \
            int(at[-1]) - int(at[0]) == len(at) - 1 and bool((at[1:] > at[:-1]).all()):
        found = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.int64) - int(at[0])
        hit = (found >= 0) & (found < len(at))
        if values.null_count:
            hit &= np.asarray(values.is_valid().to_numpy(zero_copy_only=False))
        out: np.ndarray = np.where(hit, found, -1)
        return out
    index: np.ndarray = pc.index_in(values, value_set=keys).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return index


def write_accounting(run_dir: Path, run_id: str, trace: pa.Table, unit_of: Mapping[str, int]) -> int:
    """Account run ``run_id`` (folder ``run_dir``) against ``trace`` and write its
    ``cache_accounting.parquet``; returns the rows written (0, and nothing written, when the trace
    has no prefix hashes or the run no rows).

    NumPy's arrays are allocated without huge pages meanwhile (:mod:`llmlb_bench.hugepages`): the
    accounting's few large arrays are written once or twice each, and where memory is fragmented a
    huge page's fault compacts it on the spot (100,000 requests: 1-2 CPU-s of the kernel's time in
    some runs, against an accounting of 0.6)."""
    with small_pages():
        return _write_accounting(run_dir, run_id, trace, unit_of)


def _write_accounting(run_dir: Path, run_id: str, trace: pa.Table, unit_of: Mapping[str, int]) -> int:
    if "prefix_hashes" not in trace.column_names or not len(pc.list_flatten(trace.column("prefix_hashes"))):
        return 0
    rows = _requests(run_dir / REQUESTS_FILE)
    if not rows.num_rows:
        return 0
    ids = trace.column("request_id").combine_chunks()
    index = _index_in(rows.column("request_id"), ids)
    hashes = keyed_prefix_hashes(trace)
    # where every trace row ran once, the rows are put in the trace's order and its hashes read in
    # place (taking them in the rows' order would copy every block)
    place = index if rows.num_rows == trace.num_rows and (index >= 0).all() else None
    taken = pa.array(index, mask=index < 0)                    # (a row not in the trace: null)
    if place is None or not (np.bincount(place, minlength=len(place)) == 1).all():
        hashes, place = hashes.take(taken), None
    parent = np.full(rows.num_rows, -1, dtype=np.int64)
    if "parent_id" in trace.column_names:
        parent_id = trace.column("parent_id").combine_chunks()
        parent = _index_in(parent_id, ids) if place is not None else \
            _index_in(parent_id.take(taken), rows.column("request_id").combine_chunks())
    block = trace_block_size(trace)
    table = account(hashes, parent, block, rows, unit_of, order=place)
    table = table.add_column(0, "run_id", pa.repeat(pa.scalar(run_id, pa.string()), table.num_rows))
    schema = CACHE_ACCOUNTING.schema.with_metadata(CACHE_ACCOUNTING.metadata({META_BLOCK_SIZE: str(block).encode()}))
    table = CACHE_ACCOUNTING.conform(table, run_dir / ACCOUNTING_FILE).replace_schema_metadata(schema.metadata)
    replace_table(run_dir / ACCOUNTING_FILE, [table], schema, compression="zstd", use_dictionary=["run_id", "holder"],
                  write_statistics=["run_id", "request_id"], column_encoding=_ENCODING)
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
    if "cache_accounting" in cat.empty:     # no run kept one: the join would still scan the requests
        return out
    for r in cat.rows(_SUMMARY_SQL.format(sums=sums)):
        tokens = _tokens(r)
        out[r["run_id"]] = {**_shares(tokens), "tokens": tokens, "predicted": None}
    if out:
        for r in cat.rows(_PREDICTED_SQL):
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
