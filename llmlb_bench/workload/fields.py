"""Validated reading of one table of a workload spec.

A spec is nested TOML; every problem must come back as one line naming the
file, the dotted field path (``tenants.chat.input.sigma``) and what is wrong.
:class:`Section` wraps one table with its path, reads typed fields with
bounds, and refuses unknown keys (a typo such as ``sigm`` would otherwise be
silently ignored and the experiment run with a default).
"""

from __future__ import annotations

import enum
import math
from typing import Iterator, Mapping, Sequence, TypeVar, overload

from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import unknown_choice, closest, unknown_field



class _Required(enum.Enum):
    """The default of a field that must be given (a type of its own, so mypy tells it from a default)."""

    MARK = enum.auto()


_REQUIRED = _Required.MARK
D = TypeVar("D")


class Section:
    """One table of a spec, with its dotted path and the file it came from."""

    def __init__(self, data: object, path: str, source: str) -> None:
        if not isinstance(data, Mapping):
            raise UserError(f"{path or 'spec'}: expected a table, got {_type_name(data)}", source)
        self.data: Mapping[str, object] = data
        self.path = path
        self.source = source
        self._used: set[str] = set()
        #: every name this table was asked for (read or tested with :meth:`has`): the known fields
        self._asked: set[str] = set()

    def dotted(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str | int | None, problem: str) -> UserError:
        """A :class:`UserError` for field ``key`` of this section (or the section itself); when a key
        of the table is a misspelling of a field asked for, that is the error instead (a missing or
        conflicting field is then only its symptom)."""
        typo = self._typo()
        if typo is not None:
            return typo
        name = self.dotted(key) if key is not None else (self.path or "spec")
        return UserError(f"{name}: {problem}", self.source)

    def _typo(self) -> UserError | None:
        absent = {k for k in self._asked if k not in self.data}
        for key in sorted(k for k in self.data if k not in self._asked and isinstance(k, str)):
            if closest(key, absent):
                return unknown_field(key, self._asked, self.source, f"{self.path}: " if self.path else "")
        return None

    def has(self, key: str) -> bool:
        self._asked.add(key)
        return key in self.data

    @overload
    def raw(self, key: str) -> object: ...
    @overload
    def raw(self, key: str, default: D) -> object | D: ...
    def raw(self, key: str, default: object = _REQUIRED) -> object:
        """The value of ``key`` unchecked (marks it used): the caller narrows it."""
        self._used.add(key)
        self._asked.add(key)
        if key not in self.data:
            if default is _REQUIRED:
                raise self.error(key, "missing required field")
            return default
        return self.data[key]

    def _absent(self, key: str, default: D | _Required) -> D | _Required:
        """The caller's default when ``key`` is not given (a missing required field is an error),
        else :data:`_REQUIRED`: the value is to be read and checked."""
        self.raw(key, default)
        return _REQUIRED if key in self.data else default

    @overload
    def number(self, key: str, default: float = ..., *, gt: float | None = None, ge: float | None = None,
               le: float | None = None, lt: float | None = None) -> float: ...
    @overload
    def number(self, key: str, default: None, *, gt: float | None = None, ge: float | None = None,
               le: float | None = None, lt: float | None = None) -> float | None: ...
    def number(self, key: str, default: float | None | _Required = _REQUIRED, *, gt: float | None = None,
               ge: float | None = None, le: float | None = None, lt: float | None = None) -> float | None:
        """A finite float within the given bounds."""
        given = self._absent(key, default)
        if not isinstance(given, _Required):
            return given
        return check_number(self, key, self.data[key], gt=gt, ge=ge, le=le, lt=lt)

    @overload
    def integer(self, key: str, default: int = ..., *, ge: int | None = None, le: int | None = None) -> int: ...
    @overload
    def integer(self, key: str, default: None, *, ge: int | None = None, le: int | None = None) -> int | None: ...
    def integer(self, key: str, default: int | None | _Required = _REQUIRED, *, ge: int | None = None,
                le: int | None = None) -> int | None:
        given = self._absent(key, default)
        if not isinstance(given, _Required):
            return given
        value = self.data[key]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {_show(value)}")
        if ge is not None and value < ge:
            raise self.error(key, f"must be >= {ge} (got {value})")
        if le is not None and value > le:
            raise self.error(key, f"must be <= {le} (got {value})")
        return value

    @overload
    def string(self, key: str, default: str = ..., *, choices: Sequence[str] | None = None) -> str: ...
    @overload
    def string(self, key: str, default: None, *, choices: Sequence[str] | None = None) -> str | None: ...
    def string(self, key: str, default: str | None | _Required = _REQUIRED, *,
               choices: Sequence[str] | None = None) -> str | None:
        given = self._absent(key, default)
        if not isinstance(given, _Required):
            return given
        value = self.data[key]
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {_show(value)}")
        if choices is not None and value not in choices:
            raise self.error(key, unknown_choice("value", value, choices, None).problem)
        return value

    def boolean(self, key: str, default: bool | None | _Required = _REQUIRED) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_show(value)}")
        return value

    def numbers(self, key: str, default: list[float] | _Required = _REQUIRED, *, ge: float | None = None,
                gt: float | None = None, nonempty: bool = True) -> list[float]:
        """A list of finite numbers."""
        given = self._absent(key, default)
        if not isinstance(given, _Required):
            return given
        value = self.data[key]
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of numbers, got {_show(value)}")
        if nonempty and not value:
            raise self.error(key, "must not be empty")
        return [check_number(self, f"{key}[{i}]", v, ge=ge, gt=gt) for i, v in enumerate(value)]

    @overload
    def section(self, key: str) -> Section: ...
    @overload
    def section(self, key: str, default: None) -> Section | None: ...
    @overload
    def section(self, key: str, default: Mapping[str, object]) -> Section: ...
    def section(self, key: str, default: Mapping[str, object] | None | _Required = _REQUIRED) -> Section | None:
        """The sub-table ``key`` as a :class:`Section` (``None`` if absent and optional, or the
        default table's)."""
        value = self.raw(key, default)
        if value is None and key not in self.data:
            return None
        if not isinstance(value, Mapping):
            raise self.error(key, f"expected a table, got {_show(value)}")
        return Section(value, self.dotted(key), self.source)

    def sections(self, key: str) -> list[Section]:
        """An array of tables (``[[key]]`` or ``key = [{...}, ...]``)."""
        value = self.raw(key)
        if not isinstance(value, list) or not value:
            raise self.error(key, "expected a non-empty list of tables")
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, Mapping):
                raise self.error(key, f"item {i} is {_show(item)}, expected a table")
            out.append(Section(item, f"{self.dotted(key)}[{i}]", self.source))
        return out

    def items(self) -> Iterator[tuple[str, object]]:
        return iter(self.data.items())

    def finish(self) -> None:
        """Refuse keys that were never read: they are typos or unsupported options."""
        unknown = sorted(set(self.data) - self._used)
        if unknown:
            raise unknown_field(unknown[0], self._asked, self.source, f"{self.path}: " if self.path else "")


def check_number(section: Section, key: str, value: object, *, gt: float | None = None, ge: float | None = None,
                 le: float | None = None, lt: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise section.error(key, f"expected a number, got {_show(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise section.error(key, f"must be finite (got {value})")
    if gt is not None and not value > gt:
        raise section.error(key, f"must be > {gt:g} (got {value:g})")
    if ge is not None and not value >= ge:
        raise section.error(key, f"must be >= {ge:g} (got {value:g})")
    if lt is not None and not value < lt:
        raise section.error(key, f"must be < {lt:g} (got {value:g})")
    if le is not None and not value <= le:
        raise section.error(key, f"must be <= {le:g} (got {value:g})")
    checked: float = value   # float(value) above
    return checked


def _type_name(value: object) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list"}.get(
        type(value), type(value).__name__
    )


def _show(value: object) -> str:
    text = repr(value)
    return f"{_type_name(value)} {text if len(text) <= 40 else text[:37] + '...'}"
