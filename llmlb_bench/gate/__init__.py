"""CI regression gates: compare a candidate's runs with a baseline's under rules such as
``goodput >= -5%``, deciding all rules as one family (a joint bootstrap, step-down max-T) so that
noise alone fails a build at most 1 - confidence of the time.

    from llmlb_bench.gate import parse_rule, run_gate
    out = run_gate([Path("base")], [Path("cand")], [parse_rule("goodput >= -5%")], Slo.parse("ttft=500ms"))
    out.exit_code, markdown(out), junit_xml(out)

See docs/gates.md.
"""

from llmlb_bench.gate.decide import Change, Verdict, decide, decide_family, holm, relative_change, repeats_needed
from llmlb_bench.gate.outcome import GateOutcome, junit_xml, markdown, run_gate, terminal_table, to_json
from llmlb_bench.gate.rules import METRICS, Rule, load_rules, parse_rule

__all__ = ["METRICS", "Change", "GateOutcome", "Rule", "Verdict", "decide", "decide_family", "holm", "junit_xml",
           "load_rules", "markdown", "parse_rule", "relative_change", "repeats_needed", "run_gate", "terminal_table",
           "to_json"]
