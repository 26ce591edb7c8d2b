"""A gate's outcome and its renderings: terminal table, Markdown (PR comment), JUnit XML, JSON.

Exit codes (the CLI's contract with CI): 0 every rule passes (or is within
noise), 1 at least one rule fails or a case is missing, 2 usage error.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from llmlb_bench.gate.decide import BOOTSTRAP, Verdict, decide
from llmlb_bench.gate.rules import METRICS, Rule
from llmlb_bench.gate.samples import RunSample, load_capacities, load_side
from llmlb_bench.metrics.slo import Slo

ICON = {"pass": "✅", "noise": "〰️", "fail": "❌", "missing": "❌"}


@dataclass
class GateOutcome:
    baseline: list[str]
    candidate: list[str]
    slo: str | None
    confidence: float
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def failed(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status in ("fail", "missing")]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        return {"result": "regression" if self.failed else "pass", "exit_code": self.exit_code,
                "baseline": self.baseline, "candidate": self.candidate, "slo": self.slo,
                "confidence": self.confidence, "verdicts": [v.to_dict() for v in self.verdicts]}


def run_gate(baseline: list[Path], candidate: list[Path], rules: list[Rule], slo: Slo | None,
             confidence: float = 0.95, seed: int = 0, bootstrap: int = BOOTSTRAP) -> GateOutcome:
    """Decide every rule on every case of the candidate (cases: see :mod:`llmlb_bench.gate.samples`).

    Rules on runs' requests and figures look at the runs; capacity rules at the sweeps' summaries.
    """
    out = GateOutcome([str(p) for p in baseline], [str(p) for p in candidate],
                      slo.describe() if slo else None, confidence)
    on_runs = [r for r in rules if r.metric.kind != "curve"]
    on_curves = [r for r in rules if r.metric.kind == "curve"]
    if on_runs:
        _decide_all(out, load_side(baseline, slo), load_side(candidate, slo), on_runs, seed, bootstrap)
    if on_curves:
        _decide_all(out, load_capacities(baseline), load_capacities(candidate), on_curves, seed, bootstrap)
    return out


def _decide_all(out: GateOutcome, base_cases: dict[str, list[RunSample]], cand_cases: dict[str, list[RunSample]],
                rules: list[Rule], seed: int, bootstrap: int) -> None:
    confidence = out.confidence
    for case in sorted(set(base_cases) | set(cand_cases)):
        base: list[RunSample] = base_cases.get(case, [])
        cand: list[RunSample] = cand_cases.get(case, [])
        for rule in rules:
            if not cand:
                out.verdicts.append(Verdict(case, rule.text, rule.metric.name, rule.relative,
                                            rule.describe_limit(), "missing", None, None, None, None, None, None,
                                            confidence, "case absent from the candidate"))
                continue
            out.verdicts.append(decide(case, rule, base, cand, confidence, seed, bootstrap))


def _value(v: Verdict, x: float | None) -> str:
    return METRICS[v.metric].format(x)


def _change(v: Verdict) -> str:
    return "-" if v.change is None else f"{100 * v.change:+.2f}%"


def _interval(v: Verdict) -> str:
    if v.low is None or v.high is None:
        return "-"
    if v.relative:
        return f"[{100 * v.low:+.2f}%, {100 * v.high:+.2f}%]"
    return f"[{_value(v, v.low)}, {_value(v, v.high)}]"


def _p(v: Verdict) -> str:
    return "-" if v.p_value is None else f"{v.p_value:.3g}"


def _headline(out: GateOutcome) -> str:
    n = len(out.verdicts)
    if out.failed:
        return f"❌ llmlb gate: regression — {len(out.failed)} of {n} checks failed"
    noisy = sum(v.status == "noise" for v in out.verdicts)
    return f"✅ llmlb gate: pass — {n} checks" + (f" ({noisy} within noise)" if noisy else "")


COLUMNS = ("", "case", "rule", "baseline", "candidate", "change", "interval", "p (MWU)", "note")


def _rows(out: GateOutcome) -> list[list[str]]:
    return [[ICON[v.status], v.case, v.rule, _value(v, v.baseline), _value(v, v.candidate), _change(v),
             _interval(v), _p(v), v.note] for v in out.verdicts]


def terminal_table(out: GateOutcome) -> Table:
    t = Table(title=_headline(out), title_justify="left",
              caption=f"interval: {100 * out.confidence:g}% bootstrap; p: one-sided Mann-Whitney U", caption_justify="left")
    for c in COLUMNS:
        t.add_column(c, justify="right" if c in ("baseline", "candidate", "change", "p (MWU)") else "left")
    for row in _rows(out):
        t.add_row(*row)
    return t


def markdown(out: GateOutcome) -> str:
    """A PR comment: headline, what failed and by how much, then every check."""
    lines = [f"### {_headline(out)}", ""]
    for v in out.failed:
        rank = f", Mann-Whitney p = {v.p_value:.2g}" if v.p_value is not None else ""
        by = f" ({_change(v)}, {100 * v.confidence:g}% interval {_interval(v)}{rank})" if v.relative else \
             f" (candidate {_value(v, v.candidate)}, {100 * v.confidence:g}% interval {_interval(v)})"
        lines.append(f"- **{v.case}**: `{v.rule}` failed{by}{'; ' + v.note if v.note else ''}")
    if out.failed:
        lines.append("")
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|" + "---|" * len(COLUMNS))
    for row in _rows(out):
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    lines += ["", f"Baseline: `{', '.join(out.baseline)}` · candidate: `{', '.join(out.candidate)}`"
              + (f" · SLO `{out.slo}`" if out.slo else "")
              + f" · {100 * out.confidence:g}% bootstrap intervals, one-sided Mann-Whitney U. "
              "〰️ = outside the limit but within noise (not failed)."]
    return "\n".join(lines) + "\n"


def junit_xml(out: GateOutcome) -> str:
    """One test case per (case, rule); failed and missing checks carry a <failure>."""
    suite = ET.Element("testsuite", name="llmlb-gate", tests=str(len(out.verdicts)),
                       failures=str(len(out.failed)), errors="0", skipped="0")
    for v in out.verdicts:
        tc = ET.SubElement(suite, "testcase", classname=f"llmlb.gate.{v.case}", name=v.rule)
        detail = (f"baseline {_value(v, v.baseline)}, candidate {_value(v, v.candidate)}, change {_change(v)}, "
                  f"interval {_interval(v)}, p {_p(v)}" + (f"; {v.note}" if v.note else ""))
        if v.status in ("fail", "missing"):
            ET.SubElement(tc, "failure", message=f"{v.rule}: {v.status}", type=v.status).text = detail
        else:
            ET.SubElement(tc, "system-out").text = f"{v.status}: {detail}"
    suites = ET.Element("testsuites", name="llmlb gate", tests=suite.get("tests", "0"),
                        failures=suite.get("failures", "0"))
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def to_json(out: GateOutcome) -> str:
    return json.dumps(out.to_dict(), indent=2) + "\n"
