"""Helpers shared by the sweep tests."""

from __future__ import annotations

from typing import Any

import pytest


def close(a: Any, b: Any) -> bool:
    """Equal structures whose floats agree to 1e-12 relative.

    Two sweeps with byte-identical runs can still differ in the last bit of a
    figure: metrics' ITL mean adds per-bucket sums in the row order of an
    unordered aggregate, which changes with the run folder's path.
    """
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=1e-300)
    return a == b
