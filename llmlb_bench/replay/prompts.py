"""Deterministic prompt text for trace requests, preserving the trace's prefix sharing.

A trace gives each request a length (``input_tokens``) and chained block
hashes (``prefix_hashes``, ``block_size`` tokens per block): two requests
whose leading hashes are equal share that many leading blocks. The replayer
must send text with the same sharing, so a server's prefix cache sees what
the trace describes. Each hash therefore maps to one fixed text block (a
window into a fixed pseudo-random word sequence, chosen by the hash), and a
prompt is the concatenation of its blocks' texts; tokens not covered by
hashes get a window chosen by the request id, unique to the request.

Lengths. Every word starts with a space and is a common English word, which
GPT-2/Llama-3/SentencePiece-style tokenizers encode as one token, so by
default one word stands for one token (the stated approximation; the
server's own count is recorded per request). Given the token cost of each
piece of text (:data:`PIECES`, measured with a server's tokenize endpoint
or a local tokenizer, see :mod:`llmlb_bench.replay.lengths`), each block is
filled to its exact token count instead: whole words, then a shortest exact
combination for the last few tokens, using a newline only where no word
combination fits, e.g. a one-token piece under a byte-level tokenizer (a
tokenizer that drops whitespace gives the newline no cost, and it is never
used). This is exact as long as the tokenizer does not merge across a
leading space or a single newline (true of BPE pre-tokenisers and
SentencePiece). What a piece costs at the very start of a prompt may
differ (SentencePiece-style tokenizers add a leading ``▁`` there): given
those costs too, the prompt's first block or tail is built for the budget
its first piece leaves, the same for every request that starts with it, so
sharing is kept.
"""

from __future__ import annotations

from bisect import bisect_right
from functools import lru_cache
from itertools import accumulate
from typing import Sequence

#: common English words, each one token (with its leading space) in mainstream BPE vocabularies
WORDS = tuple(dict.fromkeys("""
the of and to in is was for on that with as by at from his her it an were are which this be or
has had not but have one their they first new all after been who two more other its also into
only time over some would when she most there three may up out about than world many years
state made during can later known while under team school used year best early part second
can national between both then found own people where well city such these region since high
each left area four through being war back before series name music long life however south
north general small within five number system group following power great long several family
company around based season members film until played would university took old last place
year will game during work made like get back good way house much make said use another very
each still may way man even did right around three around home small water even must line city
set put end does point play round light kind hand field start move ask late land near read open
line show real order form food head stop tell few body color sun face ten love page keep eye a
""".split()))
#: used only to complete an exact fill that no combination of words reaches
FILLER = "\n"
#: the text pieces prompts are made of, in the order of ``PromptBuilder``'s ``costs``
PIECES = tuple(" " + w for w in WORDS) + (FILLER,)

_POOL_SIZE = 1 << 16
_MASK = (1 << 64) - 1
_TAIL_SALT = 0x7A11_5EED_0F_7E57


def _splitmix64(x: int) -> int:
    """One step of SplitMix64: a fixed, version-independent 64-bit mix."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@lru_cache(maxsize=1)
def _pool() -> tuple[int, ...]:
    """Word indices of the fixed sequence that blocks are windows of (same on every machine)."""
    n = len(WORDS)
    state, out = 0x11B1_B0A7, []
    for _ in range(_POOL_SIZE):
        state = _splitmix64(state)
        out.append(state % n)
    return tuple(out)


class PromptBuilder:
    """Materialises prompt text for ``(input_tokens, prefix_hashes, request_id)``.

    ``costs`` (tokens of each of :data:`PIECES` after other text) switches
    from the one-word-one-token approximation to exact filling;
    ``lead_costs`` (tokens of each piece at the start of a prompt) corrects
    the prompt's first piece. Block texts are cached, so shared prefixes cost
    one lookup.
    """

    def __init__(self, block_size: int, costs: Sequence[int] | None = None,
                 lead_costs: Sequence[int] | None = None, cache_blocks: int = 200_000) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.exact = costs is not None
        pool = _pool()
        words = list(PIECES[:-1])
        self._pool_words = [words[i] for i in pool] * 2  # doubled: windows may wrap around
        self._pool_index = list(pool) * 2
        costs = list(costs) if costs is not None else [1] * len(PIECES)
        if len(costs) != len(PIECES) or min(costs[:-1]) <= 0 or costs[-1] < 0:
            raise ValueError("costs must give a positive token count for every word (the filler may cost 0)")
        word_costs, filler_cost = costs[:-1], costs[-1]
        self._cum = [0, *accumulate(word_costs[i] for i in pool * 2)]
        self._fill_limit = 4 * max(word_costs)
        self._fill, self._exact, self._fill_first = _exact_fills(words, word_costs, filler_cost, self._fill_limit)
        self._extra: list[int] | None = None
        if lead_costs is not None:
            if len(lead_costs) != len(PIECES):
                raise ValueError("lead_costs must give a token count for every piece")
            self._extra = [lead - c for lead, c in zip(lead_costs, costs)]
        self._cache: dict[tuple[int, int, bool], str] = {}
        self._cache_blocks = cache_blocks

    def text(self, input_tokens: int, prefix_hashes: Sequence[int] | None, request_id: int) -> str:
        bs, remaining = self.block_size, input_tokens
        parts: list[str] = []
        for h in prefix_hashes if prefix_hashes is not None else ():
            if remaining <= 0:
                break
            t = bs if remaining >= bs else remaining
            parts.append(self._block(int(h), t, not parts))
            remaining -= t
        if remaining > 0:
            parts.append(self._text_at(_splitmix64(request_id ^ _TAIL_SALT), remaining, not parts))
        return "".join(parts)

    def continuation(self, tokens: int, request_id: int) -> str:
        """``tokens`` tokens of text unique to the request, to follow other text (a threaded
        turn's new user or tool message, :mod:`llmlb_bench.replay.threads`)."""
        return self._text_at(_splitmix64(request_id ^ _TAIL_SALT), tokens, False)

    def _block(self, h: int, tokens: int, lead: bool) -> str:
        key = (h, tokens, lead)
        text = self._cache.get(key)
        if text is None:
            if len(self._cache) >= self._cache_blocks:
                self._cache.clear()
            text = self._cache[key] = self._text_at(_splitmix64(h), tokens, lead)
        return text

    def _text_at(self, seed: int, tokens: int, lead: bool) -> str:
        """``tokens`` tokens of text at a seed-chosen place in the word pool; ``lead``: it starts the prompt."""
        start = seed % _POOL_SIZE
        extra_of = self._extra
        if not lead or extra_of is None:
            return self._window(start, tokens)[0]
        # at the start of a prompt the first piece may cost more (or less) than after other text:
        # build for the budget it leaves, re-checking once the first piece is known (a short
        # window may begin with a fill rather than a pool word)
        extra = extra_of[self._pool_index[start]]
        for _ in range(3):
            if tokens - extra < 1:
                break
            text, first = self._window(start, tokens - extra)
            if first is None or extra_of[first] == extra:
                return text
            extra = extra_of[first]
        return self._window(start, tokens)[0]  # no consistent budget: left for the length check to report

    def _window(self, start: int, tokens: int) -> tuple[str, int | None]:
        """``tokens`` tokens of text from pool position ``start``, and the index in :data:`PIECES`
        of its first piece (None for no text)."""
        out: list[str] = []
        if not self.exact:
            first = self._pool_index[start] if tokens > 0 else None
            while tokens > 0:
                take = min(tokens, _POOL_SIZE)
                out.append("".join(self._pool_words[start:start + take]))
                tokens -= take
            return "".join(out), first
        cum, limit, exact = self._cum, self._fill_limit, self._exact
        first = None
        while tokens > 0:  # as many pool words as fit, then an exact fill of the last few tokens
            base, hi = cum[start], start + _POOL_SIZE
            end = bisect_right(cum, base + tokens, lo=start, hi=hi + 1) - 1
            if end == hi:  # a whole pool's worth and more to go
                first = self._pool_index[start] if first is None else first
                out.append("".join(self._pool_words[start:end]))
                tokens -= cum[end] - base
                continue
            # back off a word or two when the fill table cannot hit the remainder exactly
            while end > start and not (tokens - (cum[end] - base) <= limit and exact[tokens - (cum[end] - base)]):
                end -= 1
            rest = tokens - (cum[end] - base)
            if first is None:
                first = self._pool_index[start] if end > start else self._fill_first[min(rest, limit)]
            out.append("".join(self._pool_words[start:end]))
            out.append(self._fill[min(rest, limit)])
            break
        return "".join(out), first


def _exact_fills(words: Sequence[str], costs: Sequence[int], filler_cost: int,
                 limit: int) -> tuple[list[str], list[bool], list[int | None]]:
    """For each total ``0..limit``: the shortest word sequence costing exactly that, else the
    filler followed by one (when the filler costs anything), else (unreachable) the fill of
    the total just below; whether the fill is exact; and the index in :data:`PIECES` of its
    first piece."""
    best: list[str | None] = [""] + [None] * limit
    lead: list[int | None] = [None] * (limit + 1)
    for total in range(1, limit + 1):
        for k, (w, c) in enumerate(zip(words, costs)):
            prev = best[total - c] if c <= total else None
            cur = best[total]
            if prev is not None and (cur is None or len(prev) + len(w) < len(cur)):
                best[total] = prev + w
                lead[total] = lead[total - c] if prev else k
    fills: list[str] = []
    exact: list[bool] = []
    firsts: list[int | None] = []
    for total, text in enumerate(best):
        first = lead[total]
        if text is None and 0 < filler_cost <= total and best[total - filler_cost] is not None:
            text, first = FILLER + best[total - filler_cost], len(words)  # type: ignore[operator]
        exact.append(text is not None)
        fills.append(text if text is not None else fills[total - 1])
        firsts.append(first if text is not None else firsts[total - 1])
    return fills, exact, firsts
