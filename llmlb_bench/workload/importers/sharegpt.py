"""ShareGPT-style conversations (``[{"id", "conversations": [{"from", "value"}, ...]}, ...]``).

The file gives lengths, not times: arrivals come from a chosen renewal
process (Poisson by default) at a chosen rate. Each human message followed
by a model reply is one request; its prompt is the whole conversation so
far, so with ``multi_turn`` a conversation becomes a session whose turns are
dependent requests (``after_parent_s`` = think time, exponential) sharing
their context as chained prefix hashes. Without it only the first exchange
is used, as in vLLM's ``benchmark_serving``.

Token counts are estimated from text length, ``chars_per_token`` characters
per token (about 4 for English with the GPT and Llama tokenizers), because
no tokenizer is available offline; pass the model's own ratio for accuracy.

A ShareGPT file is one JSON array (up to ~100k conversations), so it is
parsed whole with :mod:`json`; JSON-lines files (one conversation per line)
are read the same way line by line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.workload.arrivals import gap_sampler
from llmlb_bench.workload.importers.tabular import assemble, check_file
from llmlb_bench.workload.prefixes import OWN, SESSION, chained_hashes, stream_keys
from llmlb_bench.workload.sessions import segment_exclusive_cumsum

BLOCK = 16
HUMAN = {"human", "user"}
MODEL = {"gpt", "assistant", "chatgpt", "bard", "model"}


def _conversations(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8")
    try:
        if text.lstrip().startswith("["):
            data = json.loads(text)
        else:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise UserError(f"not valid JSON (line {exc.lineno}: {exc.msg})", path) from None
    if not isinstance(data, list):
        raise UserError("expected a JSON array of conversations", path)
    return data


def read_sharegpt(path: str | Path, rate: float, process: str = "poisson", cv: float = 1.0, seed: int = 0,
                  multi_turn: bool = False, think_s: float = 30.0, chars_per_token: float = 4.0) -> pa.Table:
    path = check_file(path)
    conversations = _conversations(path)
    sess, turn, prompt, output = [], [], [], []
    for c_index, conv in enumerate(conversations):
        messages = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(messages, list):
            raise UserError(f"conversation {c_index}: no 'conversations' list", path)
        context = 0
        k = 0
        for i in range(len(messages) - 1):
            a, b = messages[i], messages[i + 1]
            if not (isinstance(a, dict) and isinstance(b, dict)):
                raise UserError(f"conversation {c_index}: message {i} is not an object", path)
            size = math.ceil(len(str(a.get("value", ""))) / chars_per_token)
            if a.get("from") in HUMAN and b.get("from") in MODEL:
                reply = max(1, math.ceil(len(str(b.get("value", ""))) / chars_per_token))
                sess.append(c_index)
                turn.append(k)
                prompt.append(max(1, context + size))
                output.append(reply)
                k += 1
                if not multi_turn:
                    break
            context += size
    if not sess:
        raise UserError("no human message followed by a reply", path)
    session = np.asarray(sess, dtype=np.int64)
    turn_a = np.asarray(turn, dtype=np.int64)
    inp, out = np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)
    rng = np.random.default_rng(seed)
    first = turn_a == 0
    gaps = gap_sampler(process, cv)(rng, int(first.sum())) / rate
    starts = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    think = np.where(first, 0.0, rng.exponential(think_s, len(session)))
    sess_start = np.repeat(starts, np.bincount(np.cumsum(first) - 1))
    arrival = sess_start + segment_exclusive_cumsum(think, session) + think
    idx = np.arange(len(session))
    parent_row = np.where(first, -1, idx - 1)
    keys = stream_keys(SESSION, "sharegpt", session) if multi_turn else stream_keys(OWN, "sharegpt", idx)
    hashes = chained_hashes(np.stack([np.zeros_like(inp), inp], axis=1),
                            np.stack([np.zeros(len(inp), np.uint64), keys], axis=1), BLOCK)
    extra = dict(session_id=session, turn=(turn_a + 1).astype(np.int32), parent_row=parent_row,
                 after_parent_s=pa.array(think, mask=first)) if multi_turn else {}
    return assemble(arrival, inp, out, source=path, prefix_hashes=hashes, **extra)
