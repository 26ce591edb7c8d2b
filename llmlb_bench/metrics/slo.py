"""Service-level objectives: parsing ``ttft=500ms,tpot=50ms`` and the SQL predicate of a good request."""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmlb_bench.errors import UserError

#: metric name in the SLO string -> per-request SQL expression (seconds)
SLO_METRICS = {
    "ttft": "ttft_s",
    "tpot": "coalesce(tpot_s, 0)",  # vLLM counts single-token requests as meeting any TPOT SLO
    "e2e": "e2e_s",
}
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_ITEM = re.compile(r"^\s*([a-z0-9_]+)\s*=\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(us|ms|s)?\s*$")


@dataclass(frozen=True)
class Slo:
    """Per-request latency limits in seconds; a request is *good* when it is ok and meets all of them."""

    limits: tuple[tuple[str, float], ...]

    @classmethod
    def parse(cls, text: str | None, where: str = "--slo") -> "Slo | None":
        if not text:
            return None
        limits = {}
        for item in text.split(","):
            m = _ITEM.match(item)
            if not m:
                raise UserError(f"cannot parse {item.strip()!r}; expected e.g. ttft=500ms,tpot=50ms", where)
            name, value, unit = m.group(1), float(m.group(2)), m.group(3) or "ms"
            if name not in SLO_METRICS:
                raise UserError(f"unknown SLO metric {name!r} (known: {', '.join(SLO_METRICS)})", where)
            if value <= 0:
                raise UserError(f"SLO {name} must be positive", where)
            limits[name] = value * _UNITS[unit]
        return cls(tuple(limits.items()))

    def predicate(self) -> str:
        """SQL boolean over the ``request_metrics`` view's columns."""
        terms = ["status = 'ok'"] + [f"{SLO_METRICS[k]} <= {v!r}" for k, v in self.limits]
        return " AND ".join(terms)

    def describe(self) -> str:
        return ",".join(f"{k}={v * 1e3:g}ms" for k, v in self.limits)

    def to_dict(self) -> dict[str, float]:
        return {f"{k}_s": v for k, v in self.limits}
