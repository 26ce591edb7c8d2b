"""A small TOML writer for the spec subset (tables, arrays, strings, numbers, booleans).

``trace fit`` writes specs and a stored spec can be written back to a file;
the standard library reads TOML but does not write it. Short leaf tables
(no sub-tables) are written inline, which keeps fitted specs short
(``input = { dist = "lognormal", median = 812, sigma = 1.1 }``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def dumps(data: Mapping[str, Any], comment: str | None = None) -> str:
    """TOML text for ``data``; ``comment`` lines go on top."""
    lines = [f"# {c}".rstrip() for c in comment.splitlines()] if comment else []
    _table(data, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _table(data: Mapping[str, Any], path: list[str], lines: list[str]) -> None:
    nested = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, Mapping) and not _is_leaf(value):
            nested.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in nested:
        if any(v is not None and not (isinstance(v, Mapping) and not _is_leaf(v)) for v in value.values()):
            # a table holding only sub-tables needs no header of its own
            lines.append("")
            lines.append(f"[{'.'.join(_key(k) for k in [*path, key])}]")
        _table(value, [*path, key], lines)


def _is_leaf(value: Mapping[str, Any]) -> bool:
    return all(not isinstance(v, Mapping) for v in value.values()) and len(_value(value)) <= 400


def _key(key: str) -> str:
    return key if _BARE.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items() if v is not None)
        return f"{{ {inner} }}" if inner else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
