"""Gate rules: ``goodput >= -5%``, ``p99_ttft <= +10%``, ``attainment >= 0.95``, ``p99_e2e <= 20s``.

A rule is ``<metric> <op> <limit>``. A limit with ``%`` is *relative*: the
candidate's change from the baseline, (candidate / baseline - 1), must satisfy
the comparison. Any other limit is *absolute*: the candidate's own value
must satisfy it (latency limits need a unit: us, ms or s). Rules come from
``--rule`` (repeatable) or a rules file::

    # gate.toml
    rules = ["goodput >= -5%", "p99_ttft <= +10%", "attainment >= 0.95"]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import unknown_choice, check_fields, read_toml
from llmlb_bench.units import seconds


#: per-request latencies of request_metrics a rule can name; ttfa and answer_tpot are the answer's (reasoning)
LATENCIES = ("ttft", "tpot", "e2e", "ttfa", "answer_tpot")
LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99")


@dataclass(frozen=True)
class Metric:
    """What a rule measures and how a side's value of it is estimated.

    kind ``latency``: a statistic of one per-request latency over ok requests;
    ``share``: attainment, good requests / all requests;
    ``rate``: good (``goodput``) or ok (``throughput``) requests per second of duration;
    ``run``: a run-level figure of the summary (``path`` into it), averaged over a side's runs;
    ``curve``: a figure of a sweep's curve (the capacity of a workload x cluster x policy), one value
    per seed, averaged over seeds.
    """

    name: str
    kind: str
    column: str = ""
    stat: str = ""
    path: tuple[str, ...] = ()
    unit: str = ""

    def format(self, value: float | None) -> str:
        if value is None:
            return "-"
        if self.kind == "latency":
            return f"{value * 1e3:,.1f} ms" if abs(value) < 1 else f"{value:,.3f} s"
        if self.kind == "share":
            return f"{100 * value:.2f}%"
        return f"{value:,.4g}{(' ' + self.unit) if self.unit else ''}"


def _metrics() -> dict[str, Metric]:
    out = {
        "attainment": Metric("attainment", "share"),
        "goodput": Metric("goodput", "rate", column="good", unit="req/s"),
        "throughput": Metric("throughput", "rate", column="ok", unit="req/s"),
        "jain": Metric("jain", "run", path=("fairness", "jain_service")),
        "jain_attainment": Metric("jain_attainment", "run", path=("fairness", "jain_attainment")),
        "energy_per_good_token": Metric("energy_per_good_token", "run", path=("energy", "j_per_good_token"),
                                        unit="J"),
        "cost_per_good_token": Metric("cost_per_good_token", "run", path=("energy", "usd_per_m_good_tokens"),
                                      unit="$/M tokens"),
        "capacity": Metric("capacity", "curve", path=("capacity",), unit="req/s"),
    }
    # control metrics of a run with a load step (metrics/control.py): settling_ttft, overshoot_queue, ...
    for signal in ("ttft", "queue", "replicas"):
        for short, figure, unit in (("settling", "settling_s", "s"), ("overshoot", "overshoot", ""),
                                    ("steady_error", "steady_state_error", ""), ("oscillation", "sign_changes", "")):
            if short == "steady_error" and signal != "ttft":
                continue        # only TTFT has a reference (the SLO's limit)
            out[f"{short}_{signal}"] = Metric(f"{short}_{signal}", "run", path=("control", signal, figure), unit=unit)
    for lat in LATENCIES:
        for stat in LATENCY_STATS:
            out[f"{stat}_{lat}"] = Metric(f"{stat}_{lat}", "latency", column=f"{lat}_s", stat=stat)
    return out


METRICS = _metrics()
_ALIAS = re.compile(r"^(ttft|tpot|e2e|ttfa|answer_tpot)[._](mean|p50|p90|p95|p99)$")
_RULE = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(>=|<=|>|<)\s*([+-]?[0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(%|us|ms|s)?\s*$")


@dataclass(frozen=True)
class Rule:
    text: str
    metric: Metric
    op: str
    limit: float            # a fraction for relative rules (-5% -> -0.05), else the metric's unit (s for latency)
    relative: bool

    def holds(self, value: float) -> bool:
        return {">=": value >= self.limit, "<=": value <= self.limit,
                ">": value > self.limit, "<": value < self.limit}[self.op]

    @property
    def wants_higher(self) -> bool:
        """A violation is a value too low (``>=``, ``>``) rather than too high."""
        return self.op in (">=", ">")

    def describe_limit(self) -> str:
        return f"{self.limit * 100:+g}%" if self.relative else self.metric.format(self.limit)


def parse_rule(text: str, where: str = "--rule") -> Rule:
    m = _RULE.match(text)
    if not m:
        raise UserError(f"cannot parse rule {text!r}; expected e.g. 'goodput >= -5%' or 'p99_ttft <= 500ms'", where)
    name, op, number, unit = m.groups()
    alias = _ALIAS.match(name)
    if alias:
        name = f"{alias.group(2)}_{alias.group(1)}"
    metric = METRICS.get(name)
    if metric is None:
        raise unknown_choice("metric", name, sorted(METRICS), where, f"{text!r}: ")
    value = float(number)
    if unit == "%":
        return Rule(text.strip(), metric, op, value / 100, True)
    if metric.kind == "latency":
        if unit is None:
            raise UserError(f"an absolute latency limit needs a unit (us, ms, s): {text!r}", where)
        return Rule(text.strip(), metric, op, seconds(value, unit), False)
    if unit is not None:
        raise UserError(f"{name} takes a relative (%) or unitless limit, not {unit!r}: {text!r}", where)
    return Rule(text.strip(), metric, op, value, False)


def load_rules(path: str | Path) -> list[Rule]:
    """Rules from a TOML file with ``rules = [...]``."""
    path = Path(path)
    data = read_toml(path, "rules file (.toml)")
    rules = data.get("rules")
    check_fields(data, {"rules"}, path)
    if not isinstance(rules, list) or not rules or not all(isinstance(r, str) for r in rules):
        raise UserError("rules must be a non-empty list of strings such as 'goodput >= -5%'", path)
    return [parse_rule(r, f"{path}: rules[{i}]") for i, r in enumerate(rules)]
