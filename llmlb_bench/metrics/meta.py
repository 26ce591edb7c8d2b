"""Reading a run's run.json (its ``meta``) where a section may be absent: runs of older versions, of
other backends, imported results. Its values are ``object`` to mypy, so each reader narrows what it
takes; :func:`table` is the step down into a section that may not be there."""

from __future__ import annotations

from typing import Mapping


def table(meta: Mapping[str, object], *path: str) -> Mapping[str, object]:
    """The table at ``path`` under ``meta`` (``table(meta, "config", "sweep")``); empty where a step is
    absent, null or not a table."""
    out = meta
    for key in path:
        value = out.get(key)
        out = value if isinstance(value, Mapping) else {}
    return out
