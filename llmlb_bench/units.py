"""The one table of duration units, for every flag and rule that takes a time
(``--slo ttft=500ms``, gate rules ``p99_ttft <= 500ms``, ``--budget 10m``)."""

from __future__ import annotations

import re

from llmlb_bench.errors import UserError

#: seconds per unit
SECONDS: dict[str, float] = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
#: the units of a latency (a limit or a rule); a run's length also takes ``m`` and ``h``
LATENCY_UNITS = ("us", "ms", "s")

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|ms|s|m|h)?\s*$")


def seconds(value: float, unit: str) -> float:
    """``value`` in ``unit`` (a key of :data:`SECONDS`) as seconds."""
    return value * SECONDS[unit]


def parse_duration(text: str, where: str) -> float:
    """``500ms``, ``30s``, ``10m``, ``1h`` or plain seconds."""
    m = _DURATION.match(text)
    if not m:
        raise UserError(f"cannot parse {text!r}; expected a duration like 30s, 10m or 500ms", where)
    return seconds(float(m.group(1)), m.group(2) or "s")
