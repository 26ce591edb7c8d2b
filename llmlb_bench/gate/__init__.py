"""CI regression gates: compare a candidate's runs with a baseline's under rules such as
``goodput >= -5%``, deciding with bootstrap intervals and Mann-Whitney U so that noise alone
does not fail a build.

    from llmlb_bench.gate import parse_rule, run_gate
    out = run_gate([Path("base")], [Path("cand")], [parse_rule("goodput >= -5%")], Slo.parse("ttft=500ms"))
    out.exit_code, markdown(out), junit_xml(out)

See docs/gates.md.
"""

from llmlb_bench.gate.decide import Verdict, decide
from llmlb_bench.gate.outcome import GateOutcome, junit_xml, markdown, run_gate, terminal_table, to_json
from llmlb_bench.gate.rules import METRICS, Rule, load_rules, parse_rule

__all__ = ["METRICS", "GateOutcome", "Rule", "Verdict", "decide", "junit_xml", "load_rules", "markdown",
           "parse_rule", "run_gate", "terminal_table", "to_json"]
