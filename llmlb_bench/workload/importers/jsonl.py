"""JSON-lines traces with block hashes: Mooncake (FAST'25) and Qwen-Bailian (ATC'25).

Both store per request the prompt length, the output length and the hash ids
of the prompt's blocks, where an id names a block together with every block
before it (Mooncake: 512-token blocks, timestamps in ms; Bailian: 16-token
blocks, timestamps in s, plus ``chat_id``/``parent_chat_id``/``turn``/``type``).
The ids are kept as they are, as ``prefix_hashes``, with the block size in
the trace metadata.

Either may carry a ``reasoning_tokens`` field (how many of the output tokens
were reasoning; ``reasoning_length`` is accepted too): neither published file
has one, but a trace of a thinking model written in the same layout keeps
its reasoning counts this way.

A Bailian child turn keeps its recorded arrival time and gets ``parent_id``
(the chat it continues) with no ``after_parent_s``: it is sent at its
arrival time, but not before its parent completes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.workload.importers.tabular import ADAPTER_NAMES, Columns, adapters, assemble, check_file, concat, dictionary, \
    jsonl_batches, numbers

MOONCAKE_BLOCK = 512
BAILIAN_BLOCK = 16

REASONING_NAMES = ["reasoning_tokens", "reasoning_length"]
MOONCAKE = Columns(required={"time": ["timestamp"], "input": ["input_length"], "output": ["output_length"],
                             "hashes": ["hash_ids"]},
                   optional={"adapter": list(ADAPTER_NAMES), "reasoning": REASONING_NAMES})
BAILIAN = Columns(required={"time": ["timestamp"], "input": ["input_length"], "output": ["output_length"],
                            "hashes": ["hash_ids"], "chat": ["chat_id"]},
                  optional={"parent": ["parent_chat_id"], "turn": ["turn"], "type": ["type"],
                            "adapter": list(ADAPTER_NAMES), "reasoning": REASONING_NAMES})
HASHES = pa.list_(pa.uint64())


def read_mooncake(path: str | Path) -> pa.Table:
    path = check_file(path)
    time, inp, out, hashes, adapter = [], [], [], [], []
    reasoning: list[Any] = []
    for line, cols in jsonl_batches(path, MOONCAKE, {"hashes": HASHES, "time": pa.float64(), "adapter": pa.string()}):
        time.append(numbers(cols["time"], "timestamp", path, line, dtype=np.float64) / 1000.0)
        inp.append(numbers(cols["input"], "input_length", path, line))
        out.append(numbers(cols["output"], "output_length", path, line))
        hashes.append(cols["hashes"])
        if "adapter" in cols:
            adapter.append(cols["adapter"])
        _reasoning(cols, out[-1], path, line, reasoning)
    return assemble(concat(time), concat(inp), concat(out), source=path, prefix_hashes=concat(hashes),
                    adapter=adapters(concat(adapter)) if adapter else None,
                    reasoning_tokens=concat(reasoning) if reasoning else None)


def _reasoning(cols: dict[str, pa.Array], output: np.ndarray, path: Path, line: int, into: list[np.ndarray]) -> None:
    """Append one batch's reasoning counts (if the file has them), refusing more reasoning than output."""
    if "reasoning" not in cols:
        return
    r = numbers(cols["reasoning"].fill_null(0), "reasoning_tokens", path, line)  # null: no reasoning
    if (r > output).any():
        bad = int(np.argmax(r > output))
        raise UserError(f"line {line + bad}: reasoning_tokens {r[bad]} exceeds output_length {output[bad]} "
                        f"(output counts reasoning and answer)", path)
    into.append(r.astype(np.int32))


def read_bailian(path: str | Path) -> pa.Table:
    path = check_file(path)
    parts: dict[str, list[Any]] = {k: [] for k in ("time", "input", "output", "hashes", "chat", "parent", "turn", "type",
                                              "adapter", "reasoning")}
    for line, cols in jsonl_batches(path, BAILIAN, {"hashes": HASHES, "time": pa.float64(), "type": pa.string(),
                                                    "adapter": pa.string()}):
        parts["time"].append(numbers(cols["time"], "timestamp", path, line, dtype=np.float64))
        parts["input"].append(numbers(cols["input"], "input_length", path, line))
        parts["output"].append(numbers(cols["output"], "output_length", path, line))
        parts["chat"].append(numbers(cols["chat"], "chat_id", path, line))
        parts["hashes"].append(cols["hashes"])
        if "parent" in cols:
            parts["parent"].append(numbers(cols["parent"], "parent_chat_id", path, line, allow_negative=True))
        if "turn" in cols:
            parts["turn"].append(numbers(cols["turn"], "turn", path, line))
        if "type" in cols:
            parts["type"].append(cols["type"])
        if "adapter" in cols:
            parts["adapter"].append(cols["adapter"])
        _reasoning(cols, parts["output"][-1], path, line, parts["reasoning"])
    chat = concat(parts["chat"])
    parent_row = _rows_of(chat, concat(parts["parent"]), path) if parts["parent"] else None
    session = _roots(parent_row) if parent_row is not None else None
    return assemble(concat(parts["time"]), concat(parts["input"]), concat(parts["output"]), source=path,
                    prefix_hashes=concat(parts["hashes"]), parent_row=parent_row, session_id=session,
                    turn=concat(parts["turn"]).astype(np.int32) if parts["turn"] else None,
                    kind=dictionary(concat(parts["type"])) if parts["type"] else None,
                    adapter=adapters(concat(parts["adapter"])) if parts["adapter"] else None,
                    reasoning_tokens=concat(parts["reasoning"]) if parts["reasoning"] else None)


def _rows_of(chat: np.ndarray, parent_chat: np.ndarray, path: Path) -> np.ndarray:
    """Row of each parent chat id (-1 for roots, or for a parent outside this sample)."""
    order = np.argsort(chat, kind="stable")
    sorted_ids = chat[order]
    if np.any(sorted_ids[1:] == sorted_ids[:-1]):
        dup = sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]][0]
        raise UserError(f"chat_id {dup} appears more than once", path)
    pos = np.clip(np.searchsorted(sorted_ids, parent_chat), 0, len(chat) - 1)
    found = (parent_chat >= 0) & (sorted_ids[pos] == parent_chat)
    return np.where(found, order[pos], -1)


def _roots(parent_row: np.ndarray) -> np.ndarray:
    """Root row of every row (pointer doubling: log2(depth) vectorised passes)."""
    root = np.where(parent_row >= 0, parent_row, np.arange(len(parent_row)))
    for _ in range(64):
        nxt = root[root]
        if np.array_equal(nxt, root):
            break
        root = nxt
    _, session = np.unique(root, return_inverse=True)
    return session.astype(np.int64)


__all__ = ["read_mooncake", "read_bailian", "MOONCAKE_BLOCK", "BAILIAN_BLOCK"]
