"""Service-level objectives: parsing ``ttft=500ms,tpot=50ms`` and the SQL predicate of a good request.

One spec applies to every request; per-class specs, separated by ``;`` and
prefixed with the class name, override it for requests of that
``slo_class``: ``ttft=500ms,tpot=50ms;batch:e2e=60s``. A request is *good*
when it is ok and meets every limit of its class (of the default spec when
its class has none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeAlias

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.sql import quote
from llmlb_bench.units import seconds
from llmlb_bench.tomlfile import unknown_choice

#: metric name in the SLO string -> per-request SQL expression (seconds)
SLO_METRICS = {
    "ttft": "ttft_s",
    "tpot": "coalesce(tpot_s, 0)",  # vLLM counts single-token requests as meeting any TPOT SLO
    "e2e": "e2e_s",
    # the answer of a reasoning request (its first token and TPOT for the others); a request that
    # reasoned but never answered has no TTFA and meets no TTFA limit
    "ttfa": "ttfa_s",
    "answer_tpot": "coalesce(answer_tpot_s, 0)",
}
_ITEM = re.compile(r"^\s*([a-z0-9_]+)\s*=\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(us|ms|s)?\s*$")
_CLASS = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*:(.*)$")

Limits = tuple[tuple[str, float], ...]
#: an SLO as reports and run figures record it (:meth:`Slo.to_dict`): each limit in seconds by
#: ``<metric>_s`` in the order given, and ``classes``: each SLO class's limits the same way
#: (a runtime alias, not a string: the report's shape checks resolve it with typing.get_type_hints)
SloSpec: TypeAlias = dict[str, float | dict[str, dict[str, float]]]


def _parse_limits(text: str, where: str) -> Limits:
    limits: dict[str, float] = {}
    for item in text.split(","):
        m = _ITEM.match(item)
        if not m:
            raise UserError(f"cannot parse {item.strip()!r}; expected e.g. ttft=500ms,tpot=50ms", where)
        name, value, unit = m.group(1), float(m.group(2)), m.group(3) or "ms"
        if name not in SLO_METRICS:
            raise unknown_choice("SLO metric", name, SLO_METRICS, where)
        if value <= 0:
            raise UserError(f"SLO {name} must be positive", where)
        limits[name] = seconds(value, unit)
    return tuple(limits.items())


def _terms(limits: Limits) -> str:
    return " AND ".join(f"{SLO_METRICS[k]} <= {v!r}" for k, v in limits) or "TRUE"


def _describe(limits: Limits) -> str:
    return ",".join(f"{k}={v * 1e3:g}ms" for k, v in limits)


@dataclass(frozen=True)
class Slo:
    """Per-request latency limits in seconds (default, and per SLO class)."""

    limits: Limits
    classes: tuple[tuple[str, Limits], ...] = ()

    @classmethod
    def parse(cls, text: str | None, where: str = "--slo") -> "Slo | None":
        """None for no SLO; an empty or limit-less text is an error (it would silently mean none)."""
        if text is None:
            return None
        if not text.strip(" ;"):
            raise UserError("is empty: give limits such as ttft=500ms,tpot=50ms, or leave it out", where)
        default: Limits = ()
        classes: dict[str, Limits] = {}
        for part in text.split(";"):
            if not part.strip():
                continue
            m = _CLASS.match(part)
            if m:
                classes[m.group(1)] = _parse_limits(m.group(2), where)
            elif default:
                raise UserError("more than one spec without a class prefix", where)
            else:
                default = _parse_limits(part, where)
        return cls(default, tuple(classes.items()))

    def limits_for(self, slo_class: str | None) -> dict[str, float]:
        """The limits that apply to a request of ``slo_class``."""
        return dict(dict(self.classes).get(slo_class or "", self.limits))

    def predicate(self) -> str:
        """SQL boolean over the ``request_metrics`` view's columns."""
        if not self.classes:
            return " AND ".join(["status = 'ok'"] + [f"{SLO_METRICS[k]} <= {v!r}" for k, v in self.limits])
        cases = " ".join(f"WHEN slo_class = {quote(c)} THEN {_terms(lim)}" for c, lim in self.classes)
        return f"status = 'ok' AND (CASE {cases} ELSE {_terms(self.limits)} END)"

    def describe(self) -> str:
        parts = [_describe(self.limits)] if self.limits else []
        parts += [f"{c}:{_describe(lim)}" for c, lim in self.classes]
        return ";".join(parts)

    def to_dict(self) -> SloSpec:
        out: SloSpec = {f"{k}_s": v for k, v in self.limits}
        if self.classes:
            out["classes"] = {c: {f"{k}_s": v for k, v in lim} for c, lim in self.classes}
        return out
