"""The one loader of user classes named ``package.module:Class`` (routing policies, engine
schedulers, autoscalers), so every ``--policy``/``scheduler``/``autoscale.policy`` path fails alike:
one line naming the setting, the path and why."""

from __future__ import annotations

import importlib
from typing import Any, Mapping, TypeVar, overload

from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import unknown_choice


T = TypeVar("T")


@overload
def load_class(path: str, what: str, where: str, base: type[T]) -> type[T]: ...


@overload
def load_class(path: str, what: str, where: str, base: None = None) -> Any: ...


def load_class(path: str, what: str, where: str, base: type | None = None) -> Any:
    """The class at ``path`` (``package.module:Class``); ``what`` names it in errors ("policy"),
    ``where`` is the setting. With ``base`` the class must subclass it; without (a protocol, which
    issubclass cannot check), it is whatever the module holds: Any, the caller's annotation says
    what it is used as."""
    mod_name, sep, attr = path.partition(":")
    if not sep or not mod_name or not attr:
        raise UserError(f"{path!r} is not package.module:Class", where)
    try:
        cls = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"cannot load {what} {path!r}: {exc}", where) from None
    if base is not None and not (isinstance(cls, type) and issubclass(cls, base)):
        article = "an" if base.__name__[:1] in "AEIOU" else "a"
        raise UserError(f"{path!r} is not {article} {base.__name__} subclass", where)
    return cls


def make_instance(name: str, builtins: Mapping[str, type[T]], what: str, where: str, base: type[T],
                  args: Mapping[str, object], args_where: str) -> T:
    """An instance of the built-in class called ``name`` or of the user class ``name`` names
    (``package.module:Class``, a ``base`` subclass), made from ``args``; an unknown name or
    arguments its constructor refuses (TypeError, ValueError) are one line naming the setting."""
    if name in builtins:
        cls = builtins[name]
    elif ":" in name:
        cls = load_class(name, what, where, base)
    else:
        raise unknown_choice(what, name, [*builtins, "package.module:Class"], where)
    try:
        return cls(**dict(args))
    except (TypeError, ValueError) as exc:
        raise UserError(f"{what} {name!r}: {exc}", args_where) from None
