"""A deterministic tokenizer approximation that counts the replayer's prompts exactly.

The replayer (:mod:`llmlb_bench.replay.prompts`) writes prompts out of common
English words, each with one leading space, plus a newline filler, and
states that one such piece is one token. This tokenizer makes that
statement true: a token is a run of non-whitespace characters with at most
one leading space, or any other single whitespace character. So a prompt
the replayer materialises for ``input_tokens = n`` counts exactly ``n``
tokens here, and the replayer's ``--tokenize`` calibration (the cost of
each piece through ``/tokenize``) measures one token per piece, so both of
its prompt modes give the trace's lengths.

Token ids: the replayer's pieces get fixed ids (their position in
:data:`~llmlb_bench.replay.prompts.PIECES`), which also makes generated
text decodable; any other token gets an id derived from a CRC-32 of its
bytes in ``[len(PIECES), VOCAB_SIZE)``.

Prefix caching: as vLLM does, every full block of ``block_size`` token ids
is named by a hash of its parent block's hash and its own ids, so two
prompts that share their leading text share their leading block hashes, and
a trace whose requests share ``prefix_hashes`` (materialised by the
replayer as shared text) shares the same number of leading blocks here.
"""

from __future__ import annotations

import re
import zlib
from typing import Sequence

from llmlb_bench.replay.prompts import PIECES

#: ids are in ``[0, VOCAB_SIZE)``
VOCAB_SIZE = 1 << 17
_TOKEN = re.compile(r" ?\S+|\s")
_IDS = {piece: i for i, piece in enumerate(PIECES)}
_KNOWN = len(PIECES)


def _other_id(token: str) -> int:
    return _KNOWN + zlib.crc32(token.encode("utf-8", "surrogatepass")) % (VOCAB_SIZE - _KNOWN)


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens are added)."""
    pieces = _TOKEN.findall(text)
    get = _IDS.get
    ids = [get(p, -1) for p in pieces]
    if -1 in ids:
        ids = [i if i >= 0 else _other_id(p) for i, p in zip(ids, pieces)]
    return ids


def decode(ids: Sequence[int]) -> str:
    """Text of ``ids`` made of the known pieces (others have no text and are skipped)."""
    return "".join(PIECES[i] for i in ids if 0 <= i < _KNOWN)


def block_hashes(ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``ids``: block ``k`` hashes its parent's hash and its own ids.

    Unsigned 64-bit, like a trace's ``prefix_hashes`` (routing policies see them). Python's hash
    of a tuple of ints does not depend on ``PYTHONHASHSEED``; the hashes only need to agree
    within one server process."""
    out: list[int] = []
    h = 0
    for k in range(0, len(ids) - block_size + 1, block_size):
        h = hash((h, tuple(ids[k:k + block_size]))) & 0xFFFF_FFFF_FFFF_FFFF
        out.append(h)
    return out
