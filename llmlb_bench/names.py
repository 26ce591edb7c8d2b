"""Names users give that become file or folder names: run ids, capacity searches, imports.

One rule for all of them, checked before any work starts, so a name can never
reach outside the folder it is meant for: letters, digits, ``.``, ``_`` and
``-`` only (no path separator), not starting with ``.`` (so neither ``.`` nor
``..`` nor a hidden name), at most :data:`MAX_LEN` characters.
"""

from __future__ import annotations

import re

from llmlb_bench.errors import UserError

MAX_LEN = 128
_SAFE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def check_name(name: str, where: str) -> str:
    """``name`` itself when it is a safe file name, else a one-line UserError naming ``where``."""
    if not name:
        raise UserError("is empty; give a name", where)
    if len(name) > MAX_LEN:
        raise UserError(f"is {len(name)} characters long; at most {MAX_LEN}", where)
    if not _SAFE.fullmatch(name):
        raise UserError(f"{name!r} is not a plain name: use letters, digits, '.', '_' and '-' "
                        "(no '/', not starting with '.')", where)
    return name


def to_name(text: str, default: str = "run", limit: int = MAX_LEN) -> str:
    """``text`` made into a safe name (other characters become ``_``, cut to ``limit``)."""
    safe = "".join(c if c.isascii() and c.isalnum() or c in "-_." else "_" for c in text).lstrip(".")
    return safe[:limit] or default
