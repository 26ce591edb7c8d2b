"""How many tokens prompt text costs, for exact prompt lengths: a server's /tokenize or a local tokenizer.

The prompt builder (:mod:`llmlb_bench.replay.prompts`) makes text from a
fixed set of pieces (common words with a leading space, and a newline).
Exact lengths need two numbers per piece, measured once before the run:

* what it costs after other text: ``count("Hello" + piece) - count("Hello")``,
  so that special tokens a counter adds (BOS) cancel out;
* what it costs at the start of a prompt: ``count(piece) - count("")``
  (SentencePiece-style tokenizers add a leading ``▁`` there).

Two counters give them: the first endpoint's ``/tokenize`` (vLLM,
llama.cpp, ``llmlb serve``; ``--tokenize``) or a local ``tokenizer.json``
read with the ``tokenizers`` package (``--tokenizer PATH``, optional extra
``tokenizer``), which needs nothing from the server and makes no request.
Either way, prompts of a sample of the trace's rows are then counted whole,
so a tokenizer that breaks the builder's assumptions (merges across a
leading space) is reported before the run rather than discovered after it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.replay.prompts import PIECES, PromptBuilder
from llmlb_bench.run_summary import LengthCheck

if TYPE_CHECKING:
    from tokenizers import Tokenizer
from llmlb_bench.schema import trace_block_size

#: counts the tokens of each text of a batch
Counter = Callable[[list[str]], Awaitable[list[int]]]
_PROBE = "Hello"
#: trace rows whose whole prompts are counted before the run
CHECK_ROWS = 64


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` file or a folder holding one."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError("reading a local tokenizer needs the 'tokenizers' package: "
                        "pip install 'llmlb-bench[tokenizer]'", "--tokenizer") from None
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise UserError("no such file" if not p.is_dir() else "this folder holds no tokenizer.json", file)
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust side raises a bare Exception for any unreadable file
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"not a tokenizer.json the tokenizers package can read ({reason})", file) from None


def local_counter(tokenizer: Tokenizer) -> Counter:
    """A :data:`Counter` over a local tokenizer, without special tokens (the raw prompt's count)."""
    async def count(texts: list[str]) -> list[int]:
        return [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    return count


async def piece_costs(count: Counter, where: str) -> tuple[list[int], list[int]]:
    """``(after other text, at the start)`` token costs of each of :data:`PIECES`; ``where``
    names the counter's option in errors."""
    base, empty = await count([_PROBE, ""])
    after = [n - base for n in await count([_PROBE + piece for piece in PIECES])]
    lead = [n - empty for n in await count(list(PIECES))]
    bad = [piece for piece, c in zip(PIECES[:-1], after) if c <= 0]
    if bad:
        raise UserError(f"the tokenizer gave the word {bad[0]!r} no tokens", where)
    return after, lead


async def check_lengths(trace: pa.Table, builder: PromptBuilder, count: Counter,
                        rows: int = CHECK_ROWS) -> LengthCheck:
    """Count the whole prompts of the first ``rows`` text-only rows and of the shortest and
    longest one: ``{checked, exact, worst: {request_id, input_tokens, counted}}``."""
    empty, = await count([""])
    media = [0] * trace.num_rows
    for name in ("images", "audio_s"):
        if name in trace.column_names:
            media = [m or (v or 0) for m, v in zip(media, trace.column(name).to_pylist())]
    inputs = trace.column("input_tokens").to_pylist()
    text_only = [i for i in range(trace.num_rows) if not media[i] and inputs[i] > 0]
    if not text_only:
        return {"checked": 0, "exact": 0, "worst": None}
    picked = sorted(set(text_only[:rows]) | {min(text_only, key=inputs.__getitem__),
                                              max(text_only, key=inputs.__getitem__)})
    rids = trace.column("request_id").to_pylist()
    hashes = (trace.column("prefix_hashes").to_pylist() if "prefix_hashes" in trace.column_names
              else [None] * trace.num_rows)
    counted = [n - empty for n in await count([builder.text(inputs[i], hashes[i], rids[i]) for i in picked])]
    worst = max(zip(picked, counted), key=lambda p: abs(p[1] - inputs[p[0]]))
    return {"checked": len(picked), "exact": sum(c == inputs[i] for i, c in zip(picked, counted)),
            "worst": {"request_id": rids[worst[0]], "input_tokens": inputs[worst[0]], "counted": worst[1]}}


async def exact_lengths(count: Counter, trace: pa.Table | None,
                        where: str) -> tuple[list[int], list[int], LengthCheck | None]:
    """Piece costs, and the length check over ``trace`` when one is given."""
    after, lead = await piece_costs(count, where)
    check = None
    if trace is not None:
        check = await check_lengths(trace, PromptBuilder(trace_block_size(trace), after, lead), count)
    return after, lead, check


def check_note(check: LengthCheck | None, source: str) -> list[str]:
    """A warning for the user when counted prompts missed their lengths."""
    w = check["worst"] if check else None
    if not check or check["exact"] == check["checked"] or w is None:   # no worst: nothing was checked
        return []
    return [f"{source}: only {check['exact']} of {check['checked']} sampled prompts have exactly the trace's "
            f"input_tokens (request {w['request_id']}: {w['counted']} tokens for {w['input_tokens']}): the "
            "tokenizer merges across words or cannot make prompts that short from words; see the mismatch "
            "per request in server_input_tokens"]

