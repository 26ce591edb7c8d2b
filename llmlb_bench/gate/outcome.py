"""A gate's outcome and its renderings: terminal table, Markdown (PR comment), JUnit XML, JSON.

Exit codes (the CLI's contract with CI): 0 every rule passes (or is within
noise), 1 at least one rule fails or a case is missing, 2 usage error.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from llmlb_bench.console import Table
from llmlb_bench.gate.decide import BOOTSTRAP, DETECT, POWER, Verdict, decide_family
from llmlb_bench.gate.rules import METRICS, Rule
from llmlb_bench.errors import UserError
from llmlb_bench.gate.samples import ALL, RunSample, load_capacities, load_side
from llmlb_bench.metrics.comparable import differences_text
from llmlb_bench.metrics.slo import Slo

ICON = {"pass": "✅", "noise": "〰️", "fail": "❌", "missing": "❌"}


@dataclass
class GateOutcome:
    baseline: list[str]
    candidate: list[str]
    slo: str | None
    confidence: float
    detect: float = DETECT      # the regression beyond a limit that ``repeats_needed`` is for
    power: float = POWER
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def failed(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status in ("fail", "missing")]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, object]:
        return {"result": "regression" if self.failed else "pass", "exit_code": self.exit_code,
                "baseline": self.baseline, "candidate": self.candidate, "slo": self.slo,
                "confidence": self.confidence, "family_wise": True, "detect": self.detect, "power": self.power,
                "verdicts": [v.to_dict() for v in self.verdicts]}


#: the flag that lets a gate compare runs of different workloads
ALLOW_FLAG = "--allow-different-workloads"


def _key(r: RunSample) -> str:
    return json.dumps(r.workload, sort_keys=True, default=str)


def _mixed_workloads(case: str, base: list[RunSample], cand: list[RunSample]) -> str | None:
    """Why the runs of one case are not of one workload (the fields that differ), or None when they are."""
    by = {_key(r): r.workload for r in base + cand}
    if len(by) < 2:
        return None
    first, *others = by.values()
    apart = {_key(r) for r in base}.isdisjoint(_key(r) for r in cand)
    return ("" if case == ALL else f"case {case}: ") + \
        ("the baseline's and the candidate's runs" if apart else "the runs") + \
        " are not comparable (workload, load or SLO differ): " + "; ".join(differences_text(first, o) for o in others)


def run_gate(baseline: list[Path], candidate: list[Path], rules: list[Rule], slo: Slo | None,
             confidence: float = 0.99, seed: int = 0, bootstrap: int = BOOTSTRAP,
             detect: float = DETECT, power: float = POWER, allow_different: bool = False) -> GateOutcome:
    """Decide every rule on every case of the candidate (cases: see :mod:`llmlb_bench.gate.samples`) as one
    family: noise alone fails the gate with probability at most 1 - ``confidence`` (docs/gates.md).

    Rules on runs' requests and figures look at the runs; capacity rules at the sweeps' summaries. Runs of
    a case must be of one workload (:mod:`llmlb_bench.metrics.comparable`; sweeps: one SLO and target):
    otherwise a one-line error names the differing fields, unless ``allow_different``, which decides
    anyway and says so in each check's note.
    """
    out = GateOutcome([str(p) for p in baseline], [str(p) for p in candidate],
                      slo.describe() if slo else None, confidence, detect, power)
    on_runs = [r for r in rules if r.metric.kind != "curve"]
    on_curves = [r for r in rules if r.metric.kind == "curve"]
    sides = []
    if on_runs:
        sides.append((load_side(baseline, slo), load_side(candidate, slo), on_runs))
    if on_curves:
        sides.append((load_capacities(baseline), load_capacities(candidate), on_curves))
    for base_cases, cand_cases, group in sides:
        cases = [(c, base_cases.get(c, []), cand_cases.get(c, [])) for c in sorted(set(base_cases) | set(cand_cases))]
        mixed = {c: why for c, b, k in cases if (why := _mixed_workloads(c, b, k)) is not None}
        if mixed and not allow_different:
            raise UserError(f"{next(iter(mixed.values()))}; a gate compares like with like (pass {ALLOW_FLAG} "
                            "if you mean it)", f"{', '.join(out.baseline)} vs {', '.join(out.candidate)}")
        verdicts = decide_family(cases, group, confidence, seed, bootstrap, detect, power)
        for v in verdicts:
            if v.case in mixed:
                v.note = "; ".join(x for x in (v.note, f"compared anyway ({ALLOW_FLAG}): {mixed[v.case]}") if x)
        out.verdicts += verdicts
    return out


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


COLUMNS = ("", "case", "rule", "baseline", "candidate", "change", "interval", "p (family)", "repeats", "note")


def _repeats(v: Verdict) -> str:
    return "-" if v.repeats_needed is None else str(v.repeats_needed)


def _rows(out: GateOutcome) -> list[list[str]]:
    return [[ICON[v.status], v.case, v.rule, _value(v, v.baseline), _value(v, v.candidate), _change(v),
             _interval(v), _p(v), _repeats(v), "; ".join(x for x in (v.design, v.note) if x)] for v in out.verdicts]


def _legend(out: GateOutcome) -> str:
    return (f"interval: {100 * out.confidence:g}% (t over runs; bootstrap within one run); p: adjusted over all "
            f"{len(out.verdicts)} checks (Holm; step-down max-T when every check is a bootstrap), fail when < "
            f"{1 - out.confidence:g}; repeats: runs a side to catch a regression {100 * out.detect:g}% beyond the "
            f"limit with {100 * out.power:g}% power" + _single_run_warning(out))


def _single_run_warning(out: GateOutcome) -> str:
    single = sum(v.design in ("paired", "within-run") for v in out.verdicts)
    return (f". ⚠️ {single} checks had one run a side: run-to-run noise is unseen there, and such gates failed "
            "19-31% of no-change trials at level 1% in benchmarks/gate_power.py (docs/gates.md); give repeats"
            if single else "")


def terminal_table(out: GateOutcome) -> Table:
    t = Table(title=_headline(out), title_justify="left", caption=_legend(out), caption_justify="left")
    for c in COLUMNS:
        t.add_column(c, justify="right" if c in ("baseline", "candidate", "change", "p (family)", "repeats") else "left")
    for row in _rows(out):
        t.add_row(*row)
    return t


def markdown(out: GateOutcome) -> str:
    """A PR comment: headline, what failed and by how much, then every check."""
    lines = [f"### {_headline(out)}", ""]
    for v in out.failed:
        rank = f", family-wise p = {v.p_value:.2g}" if v.p_value is not None else ""
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
              + f" · {_legend(out)}. 〰️ = outside the limit but within noise (not failed)."]
    return "\n".join(lines) + "\n"


def junit_xml(out: GateOutcome) -> str:
    """One test case per (case, rule); failed and missing checks carry a <failure>."""
    suite = ET.Element("testsuite", name="llmlb-gate", tests=str(len(out.verdicts)),
                       failures=str(len(out.failed)), errors="0", skipped="0")
    for v in out.verdicts:
        tc = ET.SubElement(suite, "testcase", classname=f"llmlb.gate.{v.case}", name=v.rule)
        detail = (f"baseline {_value(v, v.baseline)}, candidate {_value(v, v.candidate)}, change {_change(v)}, "
                  f"interval {_interval(v)}, family-wise p {_p(v)}, repeats needed {_repeats(v)}"
                  + (f"; {v.note}" if v.note else ""))
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
