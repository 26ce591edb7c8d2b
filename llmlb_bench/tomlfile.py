"""Reading the TOML files users write (workload specs, clusters, sweeps, gate rules, catalogs).

One reader so every such file fails the same way: one line naming the file
and what is wrong with it (missing, a folder, not text, not TOML).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from llmlb_bench.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


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
