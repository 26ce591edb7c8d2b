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


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finaliser: a fast, well-mixed bijection on uint64."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def mix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hash of a pair of uint64 arrays (order matters)."""
    return splitmix64(splitmix64(a) ^ np.asarray(b, dtype=np.uint64))


#: Stream kinds, mixed into keys so a session and a request with equal ids never collide.
SYSTEM, SESSION, OWN = 1, 2, 3


def stream_keys(kind: int, scope: str, ids: np.ndarray) -> np.ndarray:
    """Keys of streams of one kind within one scope (a tenant or a prompt pool)."""
    base = np.uint64((zlib.crc32(scope.encode()) << 8) | kind)
    return mix(np.full(len(ids), base, dtype=np.uint64), np.asarray(ids, dtype=np.int64).astype(np.uint64))


def chained_hashes(bounds: np.ndarray, keys: np.ndarray, block_size: int) -> pa.ListArray:
    """``list<uint64>`` of ``ceil(P / block_size)`` chained hashes per request.

    ``bounds`` and ``keys`` have shape (n, L); ``bounds[:, -1]`` is the prompt
    length P. Unused leading levels have bound 0.
    """
    lengths = bounds[:, -1].astype(np.int64)
    nblocks = -(-lengths // block_size)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(nblocks, out=offsets[1:])
    total = int(offsets[-1])
    rows = np.repeat(np.arange(len(lengths)), nblocks)
    block = np.arange(total, dtype=np.int64) - offsets[:-1][rows]
    end = np.minimum((block + 1) * block_size, lengths[rows])
    level = np.zeros(total, dtype=np.int64)
    for col in range(bounds.shape[1] - 1):
        level += bounds[rows, col] < end
    values = mix(keys[rows, level], end.astype(np.uint64))
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
    return 1.0 - len(first) / flat.size
