"""Reading the TOML files users write (workload specs, clusters, sweeps, gate rules, catalogs).

One reader so every such file fails the same way: one line naming the file
and what is wrong with it (missing, a folder, not text, not TOML); and one
wording for a field the reader does not know, with the closest known name
(``unknown field 'reqests' (did you mean 'requests'?)``), used by every
reader of these files (workload specs, clusters, sweeps, gate rules).
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from llmlb_bench.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


#: how close a misspelt name must be to a known one to be suggested (difflib's ratio)
CUTOFF = 0.75


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` is most likely a misspelling of, if any is close enough."""
    near = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=CUTOFF)
    return near[0] if near else None


def unknown_field(name: str, known: Iterable[str], where: str | Path, prefix: str = "") -> UserError:
    """The one error for a field nobody reads: its closest known name, or the list of them."""
    known = sorted(set(known))
    near = closest(name, known)
    hint = f"did you mean {near!r}?" if near else f"known: {', '.join(known) or 'none'}"
    return UserError(f"{prefix}unknown field {name!r} ({hint})", where)


def check_fields(data: Mapping[str, Any], known: Iterable[str], where: str | Path, prefix: str = "") -> None:
    """Refuse the first key of ``data`` that is not a ``known`` field."""
    known = set(known)
    for name in sorted(set(data) - known):
        raise unknown_field(name, known, where, prefix)


def read_toml(path: str | Path, what: str = "TOML file") -> dict[str, Any]:
    """Parse ``path``; ``what`` names the expected kind of file in errors."""
    path = Path(path)
    if not path.exists():
        raise UserError("no such file", path)
    if not path.is_file():
        raise UserError(f"not a file, expected a {what}", path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"not valid TOML ({exc})", path) from None
    except UnicodeDecodeError:
        raise UserError("not a text file", path) from None
