"""How long a simulated answer is, and which words it says.

A real model ends its answer when it samples end-of-sequence; clients that
need a fixed length send ``ignore_eos`` (vLLM, SGLang, llama.cpp) or a
``min_tokens`` as large as ``max_tokens``, and then get exactly
``max_tokens`` tokens. Otherwise the length here is a draw from a geometric
distribution on 1, 2, 3, ... with mean ``mean_tokens`` (a constant chance
of end-of-sequence per token), raised to ``min_tokens`` and capped at
``max_tokens`` (then ``finish_reason`` is ``"length"``, else ``"stop"``).

The draw is seeded by the server's seed and the prompt's token ids, so the
same prompt always gets the same answer length and text, as with greedy
decoding, and a run is reproducible. The text is one common word per token
(the tokenizer's known pieces), so re-tokenising an answer gives back its
token count.
"""

from __future__ import annotations

import math
import random
import zlib
from array import array
from dataclasses import dataclass
from typing import Sequence

from llmlb_bench.replay.prompts import WORDS


def prompt_key(ids: Sequence[int]) -> int:
    """A stable 32-bit fingerprint of a prompt's token ids (same on every machine and Python)."""
    return zlib.crc32(array("q", ids).tobytes())


@dataclass(frozen=True)
class OutputRule:
    """Answer lengths and words; see the module docstring."""

    mean_tokens: float = 256.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.mean_tokens >= 1:
            raise ValueError("mean_tokens must be >= 1")

    def rng(self, key: int) -> random.Random:
        """The generator of one answer (``random.Random`` keeps its sequence for an int seed across versions)."""
        return random.Random((self.seed << 32) ^ key)

    def length(self, rng: random.Random, max_tokens: int, min_tokens: int, ignore_eos: bool) -> tuple[int, str]:
        """``(tokens, finish_reason)`` of an answer allowed ``min_tokens..max_tokens`` tokens."""
        if ignore_eos or min_tokens >= max_tokens:
            return max_tokens, "length"
        p = 1.0 / self.mean_tokens
        natural = 1 if p >= 1 else 1 + int(math.log1p(-rng.random()) / math.log1p(-p))
        n = max(natural, min_tokens)
        return (max_tokens, "length") if n >= max_tokens else (n, "stop")

    @staticmethod
    def next_word(rng: random.Random) -> int:
        """Index into :data:`~llmlb_bench.replay.prompts.WORDS` of the answer's next token."""
        return int(rng.random() * len(WORDS))
