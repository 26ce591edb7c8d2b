"""Reading the TOML files users write (workload specs, clusters, sweeps, gate rules, catalogs),
and writing the ones the tool makes for them (``trace fit`` and ``trace import`` specs) with
tomli-w, so what is written is standard TOML that this reader reads back.

One reader so every such file fails the same way: one line naming the file
and what is wrong with it (missing, a folder, not text, not TOML); and one
wording for a field the reader does not know, with the closest known name
(``unknown field 'reqests' (did you mean 'requests'?)``), used by every
reader of these files (workload specs, clusters, sweeps, gate rules).
"""

from __future__ import annotations

import collections.abc
import difflib
import sys
import types
import typing
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence, TypeAlias, TypeVar

import tomli_w

from llmlb_bench.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


#: a table of a TOML (or JSON) document as parsed, before its values are checked: ``object`` to mypy, so
#: the reader of each kind of file must narrow the values it takes (``Section``, :func:`check_types`)
#: before anything uses them
Table: TypeAlias = dict[str, object]
#: a value of a document this tool writes (a spec that ``trace fit`` makes, a distribution's ``to_dict``):
#: TOML's tables, arrays, strings, numbers and booleans, and None for a value left out (TOML has no null)
Value: TypeAlias = "str | int | float | bool | None | Sequence[Value] | Mapping[str, Value]"

R = TypeVar("R")


#: how close a misspelt name must be to a known one to be suggested (difflib's ratio)
CUTOFF = 0.75


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` is most likely a misspelling or a shortening of, if any is close enough
    (the one known name it begins, else difflib's closest: 'h100' is 'h100-sxm', not 'h200')."""
    known = sorted(set(known))
    started = [k for k in known if k.lower().startswith(name.lower())] if name else []
    if len(started) == 1:
        return started[0]
    near = difflib.get_close_matches(name, known, n=1, cutoff=CUTOFF)
    return near[0] if near else None


def unknown_choice(kind: str, name: str, known: Iterable[str], where: str | Path | None,
                   prefix: str = "", list_known: bool = True) -> UserError:
    """The one error for a name that is none of the known ones, whatever it names (a field, a policy,
    a GPU, a format, a reproduction): ``unknown GPU 'h100sxm' (did you mean 'h100-sxm'? known:
    a100-80g, ...)``. The known names follow the guess unless ``list_known`` is false (then they
    stand only where there is no guess); ``known`` is listed in its own order (registries list
    theirs in a meaningful one)."""
    known = list(dict.fromkeys(known))
    near = closest(name, known)
    listed = f"known: {', '.join(known) or 'none'}"
    hint = (f"did you mean {near!r}?" + (f" {listed}" if list_known else "")) if near else listed
    return UserError(f"{prefix}unknown {kind} {name!r} ({hint})", where)


def unknown_field(name: str, known: Iterable[str], where: str | Path, prefix: str = "") -> UserError:
    """The one error for a field nobody reads: its closest known name, or the list of them."""
    return unknown_choice("field", name, sorted(set(known)), where, prefix, list_known=False)


def check_fields(data: Mapping[str, object], known: Iterable[str], where: str | Path, prefix: str = "") -> None:
    """Refuse the first key of ``data`` that is not a ``known`` field."""
    known = set(known)
    for name in sorted(set(data) - known):
        raise unknown_field(name, known, where, prefix)


def _accepted(annotation: object) -> tuple[type, ...] | None:
    """The TOML value types a field of this type annotation takes (None: any)."""
    if annotation is object:
        return None
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        out: list[type] = []
        for a in args:
            got = _accepted(a)
            if got is None:
                return None
            out.extend(got)
        return tuple(out)
    base = origin or annotation
    if base is type(None):
        return (type(None),)
    if base is float:
        return (int, float)
    if base in (tuple, list, collections.abc.Sequence):
        return (list, tuple)
    if base in (dict, collections.abc.Mapping):
        return (dict,)
    return (base,) if isinstance(base, type) else None


def check_types(data: Mapping[str, object], hints: Mapping[str, object], where: str | Path, prefix: str = "") -> None:
    """Refuse the first value of ``data`` whose type its field's annotation in ``hints`` does not allow
    (a list where a GPU name goes, a string for a count): one line, not a TypeError further on."""
    for name, value in data.items():
        accepted = _accepted(hints[name]) if name in hints else None
        if accepted is None or (isinstance(value, accepted) and not (isinstance(value, bool) and bool not in accepted)):
            continue
        want = " or ".join(_TOML_NAMES.get(t, t.__name__) for t in dict.fromkeys(accepted))
        raise UserError(f"{prefix}{name}: expected {want}, got {_TOML_NAMES.get(type(value), type(value).__name__)}",
                        where)


def as_table(value: object, where: str | Path, problem: str = "expected a table") -> Mapping[str, object]:
    """``value`` if it is a table (a TOML table, a JSON object), else one line naming ``where``."""
    if not isinstance(value, Mapping):
        raise UserError(problem, where)
    return value


def construct(record: Callable[..., R], values: Mapping[str, object]) -> R:
    """``record(**values)`` for values mypy cannot follow by name: a parsed table's, whose types are
    checked where the table is parsed (before, by :func:`check_types` against the record's annotations,
    or by the record's own checks right after), or fields copied by name from records of the same type.
    The one place where such values, ``object`` to mypy, become typed fields."""
    return record(**values)


_TOML_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true/false", list: "an array",
               tuple: "an array", dict: "a table", type(None): "nothing"}


#: the kinds of TOML file users give, each told apart by top-level keys only it has, and what takes it
KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "workload spec": (("tenants",), "llmlb gen, run or capacity"),
    "sweep file": (("workloads", "load"), "llmlb sweep"),
    "cluster file": (("replicas", "pools"), "--cluster"),
    "rules file": (("rules",), "llmlb gate --rules"),
}


def kind_of(data: Mapping[str, object]) -> str | None:
    """The kind of file ``data`` is (a key of :data:`KINDS`), when exactly one kind's keys are there."""
    found = [kind for kind, (keys, _) in KINDS.items() if any(k in data for k in keys)]
    return found[0] if len(found) == 1 else None


def read_toml(path: str | Path, what: str = "TOML file") -> Table:
    """Parse ``path``; ``what`` names the expected kind of file in errors. A file of another kind of
    :data:`KINDS` is refused as such ("this is a workload spec, not a sweep file"), rather than by the
    first of its fields the expected kind does not have."""
    path = Path(path)
    if not path.exists():
        near = path.parent.is_dir() and closest(path.name, (p.name for p in path.parent.glob("*.toml")))
        raise UserError(f"no such file (did you mean {str(path.with_name(near))!r}?)" if near else "no such file", path)
    if not path.is_file():
        raise UserError(f"not a file, expected a {what}", path)
    try:
        data: Table = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"not valid TOML ({exc})", path) from None
    except UnicodeDecodeError:
        raise UserError("not a text file", path) from None
    expected, other = what.removesuffix(" (.toml)"), kind_of(data)
    if expected in KINDS and other not in (None, expected):
        raise UserError(f"this is a {other}, not a {expected} (a {other} goes to {KINDS[other][1]})", path)
    return data


def dumps_toml(data: Mapping[str, Value], comment: str | None = None) -> str:
    """TOML text for ``data``, ``None`` values left out (TOML has no null); ``comment`` lines on top."""
    head = "".join(f"# {line}".rstrip() + "\n" for line in comment.splitlines()) + "\n" if comment else ""
    return head + tomli_w.dumps(_without_none(data))


def _without_none(table: Mapping[str, Value]) -> dict[str, Value]:
    return {k: _value_without_none(v) for k, v in table.items() if v is not None}


def _value_without_none(value: Value) -> Value:
    if isinstance(value, Mapping):
        return _without_none(value)
    if isinstance(value, (list, tuple)):
        return [_value_without_none(v) for v in value]
    return value
