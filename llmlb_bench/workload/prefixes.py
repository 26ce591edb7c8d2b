"""Chained prefix-block hashes: prefix sharing made explicit and measurable.

A prompt is cut into blocks of ``block_size`` tokens (the last one may be
partial, as in Mooncake's and Qwen-Bailian's traces: ``ceil(len/B)`` hashes).
A block's hash names the block *together with every token before it*, so two
requests share their first k hashes exactly when they share the first k
blocks of prompt.

Generated prompts are never materialised as tokens. Instead every prompt is
a prefix of a nested set of *streams*: a shared system prompt, then the
conversation (or agent context) it belongs to, then its own new tokens. A
request carries, per level, the end position of that level and the stream's
key (``bounds`` and ``keys``, shape (n, L), ascending bounds, the last one
equal to the prompt length). Token position p belongs to the first level
whose bound is >= p, and since a stream's content up to p is fixed by the
stream's key, ``hash(key, p)`` names the whole prefix up to p. Hashing is
one vectorised pass over all blocks.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The SplitMix64 finaliser: a fast, well-mixed bijection on uint64 (in place when ``out`` is given)."""
    with np.errstate(over="ignore"):
        z = np.add(np.asarray(x, dtype=np.uint64), _GOLDEN, out=out)
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
        result: np.ndarray = z
        return result


def mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hash of a pair of uint64 arrays (order matters)."""
    return splitmix64(splitmix64(a) ^ np.asarray(b, dtype=np.uint64))


#: Stream kinds, mixed into keys so a session and a request with equal ids never collide.
SYSTEM, SESSION, OWN = 1, 2, 3
#: a join request's own tokens (agents.Fanout.join): keyed apart from the children's own streams
JOIN = 4


def stream_keys(kind: int, scope: str, ids: np.ndarray) -> np.ndarray:
    """Keys of streams of one kind within one scope (a tenant or a prompt pool)."""
    base = np.uint64((zlib.crc32(scope.encode()) << 8) | kind)
    return mix(np.full(len(ids), base, dtype=np.uint64), np.asarray(ids, dtype=np.int64).astype(np.uint64))


def chained_hashes(bounds: np.ndarray, keys: np.ndarray, block_size: int,
                   chunk_blocks: int = 1 << 22) -> pa.ListArray:
    """``list<uint64>`` of ``ceil(P / block_size)`` chained hashes per request.

    ``bounds`` and ``keys`` have shape (n, L); ``bounds[:, -1]`` is the prompt
    length P. Unused leading levels have bound 0. Block j (ending at
    e = min((j+1) B, P)) belongs to the first level whose bound is >= e, so
    the blocks of level l are those ending after level l-1's bound: per
    request and level that is a count, and the blocks' keys are one
    ``np.repeat`` of the per-level keys. Work goes in chunks of about
    ``chunk_blocks`` blocks so temporaries stay small.
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    lengths = bounds[:, -1]
    nblocks = -(-lengths // block_size)
    # blocks ending at or before each level's bound (all blocks for the last level)
    upto = np.where(bounds < lengths[:, None], bounds // block_size, nblocks[:, None])
    upto[:, -1] = nblocks
    counts = np.diff(upto, axis=1, prepend=0)
    level_keys = splitmix64(keys)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(nblocks, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.uint64)
    row = 0
    while row < len(lengths):
        stop = int(np.searchsorted(offsets, offsets[row] + chunk_blocks, side="right"))
        stop = min(max(stop - 1, row + 1), len(lengths))
        lo, hi = int(offsets[row]), int(offsets[stop])
        key = np.repeat(level_keys[row:stop].ravel(), counts[row:stop].ravel())
        # end of block j is (j + 1) B, except the last block of each prompt, which ends at P
        end = np.arange(1, hi - lo + 1, dtype=np.int64)
        end -= np.repeat(offsets[row:stop] - lo, nblocks[row:stop])
        end *= block_size
        has = nblocks[row:stop] > 0
        end[(offsets[row + 1:stop + 1] - lo - 1)[has]] = lengths[row:stop][has]
        key ^= end.view(np.uint64)
        splitmix64(key, out=values[lo:hi])
        row = stop
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.uint64()))


def reuse_ratio(hashes: pa.ListArray | pa.ChunkedArray) -> float:
    """Fraction of prompt blocks already seen earlier in the trace (an infinite prefix cache).

    Counting blocks rather than tokens keeps this exact for the data we have
    (the last partial block of a prompt counts as one block).
    """
    if isinstance(hashes, pa.ChunkedArray):
        hashes = hashes.combine_chunks()
    flat = hashes.flatten().to_numpy()
    if flat.size == 0:
        return 0.0
    _, first = np.unique(flat, return_index=True)
    result: float = 1.0 - len(first) / flat.size
    return result
