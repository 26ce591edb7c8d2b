"""Look up routing policies by name, with ``key=value`` parameters.

A name is either a built-in policy's ``name`` or a dotted path
``package.module:ClassName`` to a user's own class, so users plug in a
policy without editing this package.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Mapping

from llmlb_bench.errors import UserError
from llmlb_bench.policies.base import Policy
from llmlb_bench.policies.routing import LeastOutstanding, RoundRobin

BUILTIN: dict[str, type[Policy]] = {cls.name: cls for cls in (RoundRobin, LeastOutstanding)}


def parse_args(pairs: list[str] | None, where: str = "--policy-arg") -> dict[str, Any]:
    """Parse ``key=value`` strings; values become int, float, bool or str."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UserError(f"expected key=value, got {pair!r}", where)
        out[key.strip()] = _coerce(raw.strip())
    return out


def _coerce(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def policy_class(name: str) -> type[Policy]:
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" in name:
        mod_name, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as exc:
            raise UserError(f"cannot load policy {name!r}: {exc}", "--policy") from None
    raise UserError(f"unknown policy {name!r} (known: {', '.join(sorted(BUILTIN))})", "--policy")


def make_policy(name: str, args: Mapping[str, Any] | None = None) -> Policy:
    """Instantiate a policy, checking parameter names against its constructor."""
    cls = policy_class(name)
    args = dict(args or {})
    sig = inspect.signature(cls.__init__)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    unknown = [k for k in args if k not in sig.parameters or k == "self"]
    if unknown and not accepts_any:
        raise UserError(f"policy {name!r} has no parameter {unknown[0]!r}", "--policy-arg")
    try:
        return cls(**args)
    except (TypeError, ValueError) as exc:
        raise UserError(f"policy {name!r}: {exc}", "--policy-arg") from None
