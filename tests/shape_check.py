"""Whether a document read back from JSON has the shape its TypedDict declares (run_summary.RunSummary,
report.shape.ReportDoc): mypy checks the code that writes them, this checks what was written, so a
section a producer fills with keys its type does not declare (or without one it requires) fails."""

from __future__ import annotations

import types
import typing
from typing import Any, Union


def mismatches(value: object, hint: Any, where: str = "") -> list[str]:
    """Where ``value`` departs from the type ``hint``: a key a TypedDict does not declare, a required key
    missing, a value of another type (an int where a float is declared is a float, as JSON writes it)."""
    if hint is Any or hint is object:
        return []
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        arms = typing.get_args(hint)
        if value is None and type(None) in arms:
            return []
        found = [mismatches(value, arm, where) for arm in arms if arm is not type(None)]
        return [] if any(not f for f in found) else min(found, key=len)
    if typing.is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not a {hint.__name__}"]
        hints = typing.get_type_hints(hint)
        out = [f"{where}.{k}: not declared in {hint.__name__}" for k in value if k not in hints]
        out += [f"{where}.{k}: missing, {hint.__name__} requires it" for k in hint.__required_keys__ if k not in value]
        return out + [m for k, v in value.items() if k in hints for m in mismatches(v, hints[k], f"{where}.{k}")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not a dict"]
        item = typing.get_args(hint)[1]
        return [m for k, v in value.items() for m in mismatches(v, item, f"{where}[{k!r}]")]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        item = typing.get_args(hint)[0]
        return [m for i, v in enumerate(value) for m in mismatches(v, item, f"{where}[{i}]")]
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    return [] if ok else [f"{where}: {value!r} is not a {getattr(hint, '__name__', hint)}"]
