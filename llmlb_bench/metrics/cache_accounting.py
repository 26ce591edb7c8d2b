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
rewrite of its token segments); and the work is NumPy over the trace's flattened hashes (two
vectorised sorts of packed 64-bit keys, blocks by arrival and then by hash, and a radix sort by
target), not a Python walk per block (docs/prefix-cache.md has the measured cost). Every bucket
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

#: the loss buckets, in the order of the identity above (all but achieved)
LOSSES = ("granularity", "failed", "routing", "in_flight", "eviction", "stale", "unmeasured")

_NEEDED = ["request_id", "target", "prefill_target", "status", "scheduled_s", "sent_s", "first_token_s",
           "input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens", "predicted_cached_tokens"]


def _first_unflagged(out: np.ndarray, flags: np.ndarray, owner: np.ndarray, pos: np.ndarray) -> None:
    """Lower ``out[row]`` to the position of the row's first block that is not flagged, among these
    blocks (``flags``, ``owner`` and ``pos`` aligned; ``out`` starts at the rows' lengths): after every
    part of the blocks, ``out`` holds how many of each row's blocks are flagged before the first that is not.

    ``owner`` is non-decreasing (a row's blocks come in prompt order), so a row's first unflagged
    block is the first of its own among the unflagged ones: no scatter-minimum needed."""
    miss = np.flatnonzero(~flags)
    if len(miss):
        rows = owner[miss]
        first = np.r_[True, rows[1:] != rows[:-1]]
        rows = rows[first]
        out[rows] = np.minimum(out[rows], pos[miss[first]])


def _ranks(primary: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Rank of each row by (``primary``, request id); NaN sorts last."""
    key = np.where(np.isnan(primary), np.inf, primary)
    order = np.lexsort((ids, key))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return rank


def _lists(hashes: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list column of hashes as (values, row lengths, offsets); the values without a copy where
    the column is one chunk (null lists have no values)."""
    lengths = pc.list_value_length(hashes).fill_null(0).to_numpy().astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.asarray(pc.list_flatten(hashes).to_numpy(), dtype=np.uint64)
    return values, lengths, offsets


#: blocks accounted at once: the working arrays (a dozen words per block) grow with this, not with the run
CHUNK_BLOCKS = 1 << 20


def _parts(values: np.ndarray, replies: np.ndarray, offsets: np.ndarray, chunk: int
           ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """The blocks in parts by hash, each about ``chunk`` blocks: per part ``(hashes, owner, pos,
    reply)``, its blocks' hashes (in the order of ``values``), their rows and positions in the row,
    and the indices in ``replies`` (indices into ``values`` of the reply blocks) of its reply blocks.

    Every bucket compares a block only with blocks of the same hash, so a part that holds whole
    hash groups is accounted on its own, and the result does not depend on how many parts there
    are (tested against one part): the run's length sets how many parts, not how large each is.
    A part is the top bits of the spread hash; beyond the trace, what every part needs is one
    byte per block (its part) and the rows' own arrays."""
    total = len(values) + len(replies)
    bits = max(0, math.ceil(math.log2(max(total, 1) / chunk)))
    if not bits:
        owner = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
        pos = np.arange(len(values), dtype=np.int64) - offsets[:-1][owner]
        yield values, owner, pos, np.arange(len(replies), dtype=np.int64)
        return
    part = np.empty(len(values), dtype=np.uint8 if bits <= 8 else np.uint16)
    for a in range(0, len(values), chunk):
        part[a:a + chunk] = (values[a:a + chunk] * _SPREAD) >> np.uint64(64 - bits)
    reply_part = part[replies]
    for k in range(1 << bits):
        index = np.flatnonzero(part == k)
        owner = np.searchsorted(offsets, index, side="right") - 1
        yield values[index], owner, index - offsets[owner], np.flatnonzero(reply_part == k)


def _order(keys: np.ndarray) -> np.ndarray:
    """The stable sorting permutation of non-negative integer ``keys``: NumPy's vectorised ``sort`` of
    each key packed with its index in one 64-bit word, several times faster than ``argsort``."""
    m = len(keys)
    bits = max(m - 1, 1).bit_length()
    if not m or int(keys.max()) >= 1 << (63 - bits):
        out: np.ndarray = np.argsort(keys, kind="stable")
        return out
    packed = np.sort((keys.astype(np.int64) << bits) | np.arange(m, dtype=np.int64))
    order: np.ndarray = packed & ((1 << bits) - 1)
    return order


#: an odd multiplier (2^64 / golden ratio): multiplying by it permutes the 64-bit words and spreads
#: hashes that differ only in their low bits (small integers) over the high ones
_SPREAD = np.uint64(0x9E3779B97F4A7C15)


def _hash_order(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A permutation that brings equal 64-bit ``values`` together, each group in index order (the
    groups in no meaningful order), and the values in that order. One vectorised sort of (high bits
    of the spread value, index) packed in a word; the rare runs where distinct values share those
    high bits are sorted again by value."""
    m = len(values)
    bits = max(m - 1, 1).bit_length()
    high = (values * _SPREAD) >> np.uint64(bits)
    packed = np.sort((high << np.uint64(bits)) | np.arange(m, dtype=np.uint64))
    order = (packed & np.uint64((1 << bits) - 1)).astype(np.int64)
    hv, hh = values[order], packed >> np.uint64(bits)
    same = hh[1:] == hh[:-1]
    clash = same & (hv[1:] != hv[:-1])
    if clash.any():
        run = np.cumsum(np.r_[True, ~same]) - 1
        bad = np.zeros(int(run[-1]) + 1, dtype=bool)
        bad[run[1:][clash]] = True
        sel = np.flatnonzero(bad[run])
        sub = order[sel]
        order[sel] = sub[np.lexsort((sub, values[sub], run[sel]))]
        hv[sel] = values[order[sel]]
    return order, hv


def _grouped(values: np.ndarray, owner: np.ndarray, arrival: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The blocks grouped by hash, each group in arrival order (``arrival``: ranks of the owners;
    ties in index order): ``(perm, owners, group, seen, shared)`` in that order, ``perm`` the block
    indices, ``owners`` their owners, ``group`` each one's group (0, 1, ...), ``seen`` whether an
    earlier arrival named the hash, ``shared`` whether any other block has it (only those can be
    hits or give one).

    Two vectorised sorts of packed keys (blocks by arrival, then by hash), no ``argsort`` of the
    64-bit hashes: within a group the first block is the earliest arrival, so a block is seen
    earlier unless its owner arrived as early as that one."""
    by_arrival = _order(arrival[owner])
    order, hv = _hash_order(values[by_arrival])
    perm = by_arrival[order]
    m = len(perm)
    start = np.ones(m, dtype=bool)
    start[1:] = hv[1:] != hv[:-1]
    group = np.cumsum(start) - 1
    owners = owner[perm]
    when = arrival[owners]
    seen = when != when[start][group]
    counts = np.diff(np.r_[np.flatnonzero(start), m])
    return perm, owners, group, seen, counts[group] > 1


def _unsorted(perm: np.ndarray, flags: np.ndarray) -> np.ndarray:
    """``flags`` given in the order ``perm`` (a permutation), back in index order."""
    out = np.empty(len(flags), dtype=bool)
    out[perm] = flags
    return out


def _replies(values: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, parent: np.ndarray,
             inp: np.ndarray, out: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(index in ``values``, providing row) of the blocks a request computed beyond its prompt, its reply: a
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
    return at, np.repeat(p, count)


def offered_tokens(trace: pa.Table, block: int) -> np.ndarray:
    """Per trace row, the offered reuse in tokens (earlier = earlier ``arrival_s``, then request id):
    what one unbounded cache shared by every target would serve, before any engine's granularity."""
    inp = trace.column("input_tokens").to_numpy().astype(np.int64)
    if "prefix_hashes" not in trace.column_names:
        return np.zeros(len(inp), dtype=np.int64)
    values, lengths, offsets = _lists(keyed_prefix_hashes(trace))   # no reuse across LoRA adapters
    arrival = _ranks(trace.column("arrival_s").to_numpy(), trace.column("request_id").to_numpy())
    offered = lengths.copy()
    for hashes, owner, pos, _ in _parts(values, np.zeros(0, np.int64), offsets, CHUNK_BLOCKS):
        perm, _, _, seen, _ = _grouped(hashes, owner, arrival)
        _first_unflagged(offered, _unsorted(perm, seen), owner, pos)
    cached: np.ndarray = np.minimum(offered * block, inp)
    return cached


@dataclass
class _Rows:
    """What the per-block passes read of the rows (aligned with them), and the leading blocks they find."""

    arrival: np.ndarray     # rank by (scheduled_s, request id)
    done: np.ndarray        # rank by (first_token_s, request id); no first token ranks last
    provide: np.ndarray     # done, or n + 1 for a row that never computed its prompt
    finished: np.ndarray    # first_token_s, sorted (inf for none)
    sent: np.ndarray
    holder: np.ndarray      # index of the row's target in the sorted names, -1 for none
    targets: int            # how many names
    offered: np.ndarray     # out: per row, leading blocks seen in an earlier arrival's prompt or reply
    reach: np.ndarray       # out: ... reachable on its target
    ready: np.ndarray       # out: ... reachable and computed before it was sent


def _account_part(r: _Rows, values: np.ndarray, owner: np.ndarray, pos: np.ndarray, provider: np.ndarray) -> None:
    """The leading offered, reachable and ready blocks of one part (:func:`_parts`): ``values`` and
    ``owner`` the part's prompt blocks, then its reply blocks (``provider`` their rows); ``pos`` the
    prompt blocks' positions."""
    m = len(pos)
    owner = np.concatenate([owner, provider])
    perm, owners, group_of, seen, shared = _grouped(values, owner, r.arrival)
    _first_unflagged(r.offered, _unsorted(perm, seen)[:m], owner[:m], pos)

    # reachable: on the same target, an earlier arrival that computed the block (prefill done)
    # before this request's prefill finished; per (target, hash) group in arrival order, the
    # earliest such finish among the earlier members (a running max of group * big - finish rank).
    # Only blocks whose hash occurs more than once take part (in a low-reuse trace, few do). The
    # blocks are already grouped by hash in arrival order: a stable radix sort by target completes
    # the (target, hash, arrival) order.
    n = len(r.arrival)
    never = n + 1
    held = r.holder[owners]
    sub = np.flatnonzero(shared & (held >= 0))
    by_target = np.argsort(held[sub].astype(np.uint16) if r.targets < 1 << 16 else held[sub], kind="stable")
    sub = sub[by_target]
    order, so = perm[sub], owners[sub]
    hk, vk = held[sub], group_of[sub]
    start = np.ones(len(order), dtype=bool)
    start[1:] = (hk[1:] != hk[:-1]) | (vk[1:] != vk[:-1])
    group = np.cumsum(start) - 1
    big = n + 2
    run = np.maximum.accumulate(group * big - r.provide[so]) if len(order) else group
    earliest = np.full(len(order), never, dtype=np.int64)
    inner = np.flatnonzero(~start)
    earliest[inner] = group[inner] * big - run[inner - 1]
    reach = np.zeros(len(values), dtype=bool)
    ready = np.zeros(len(values), dtype=bool)
    hit = earliest < r.done[so]
    reach[order] = hit
    ready[order] = hit & (r.finished[np.minimum(earliest, max(n - 1, 0))] <= r.sent[so])
    _first_unflagged(r.reach, reach[:m], owner[:m], pos)
    _first_unflagged(r.ready, ready[:m], owner[:m], pos)


def account(hashes: pa.Array | pa.ChunkedArray, parent: np.ndarray, block: int, rows: pa.Table,
            unit_of: Mapping[str, int], chunk_blocks: int = CHUNK_BLOCKS) -> pa.Table:
    """The per-request buckets (``CACHE_ACCOUNTING`` columns but ``run_id``) for ``rows`` (a
    requests table) whose trace rows' ``prefix_hashes`` are ``hashes`` and whose parents (a
    previous turn) are the rows ``parent`` (-1: none), both aligned with ``rows``. ``unit_of``:
    each target's engine KV block in tokens (targets not named: the trace block). The blocks are
    accounted in parts of about ``chunk_blocks`` (:func:`_parts`; the result is the same for any)."""
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
    sched = rows.column("scheduled_s").fill_null(np.nan).to_numpy()
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
    r = _Rows(arrival=_ranks(sched, ids), done=done, provide=np.where(np.isnan(first), n + 1, done),
              finished=np.sort(np.where(np.isnan(first), np.inf, first)), sent=sent, holder=holder,
              targets=len(names), offered=lengths.copy(), reach=lengths.copy(), ready=lengths.copy())
    for part, owner, pos, reply in _parts(values, replies, offsets, chunk_blocks):
        _account_part(r, np.concatenate([part, values[replies[reply]]]), owner, pos, provider[reply])

    def tokens(blocks: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.minimum(blocks * block, inp)
        return out

    def engine(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.maximum(np.minimum(x, inp - 1), 0) // unit * unit
        return out

    offered = tokens(r.offered)
    o2, r2, v2 = engine(offered), engine(tokens(r.reach)), engine(tokens(r.ready))
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
    rows = _requests(run_dir / REQUESTS_FILE)
    if not rows.num_rows:
        return 0
    index = pc.index_in(rows.column("request_id"), value_set=trace.column("request_id").combine_chunks())
    hashes = keyed_prefix_hashes(trace).take(index)
    parent = np.full(rows.num_rows, -1, dtype=np.int64)
    if "parent_id" in trace.column_names:
        parent_id = trace.column("parent_id").combine_chunks().take(index)
        at = pc.index_in(parent_id, value_set=rows.column("request_id").combine_chunks())
        parent = at.fill_null(-1).to_numpy().astype(np.int64)
    block = trace_block_size(trace)
    table = account(hashes, parent, block, rows, unit_of)
    table = table.add_column(0, "run_id", pa.array([run_id] * table.num_rows, pa.string()))
    schema = CACHE_ACCOUNTING.schema.with_metadata(CACHE_ACCOUNTING.metadata({META_BLOCK_SIZE: str(block).encode()}))
    table = CACHE_ACCOUNTING.conform(table, run_dir / ACCOUNTING_FILE).replace_schema_metadata(schema.metadata)
    replace_table(run_dir / ACCOUNTING_FILE, [table], schema, compression="zstd")
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
