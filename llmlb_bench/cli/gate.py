"""``llmlb gate``: fail a CI job when the candidate's runs regress against the baseline's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import SloOpt
from llmlb_bench.errors import UserError
from llmlb_bench.metrics.slo import Slo

Out = Optional[Path]


def _write(path: Path | None, text: str) -> None:
    if path is None:
        return
    if str(path) == "-":
        sys.stdout.write(text)
    else:
        from llmlb_bench.store.run import write_text_atomic

        write_text_atomic(path, text)


@app.command()
def gate(
    baseline: Annotated[Path, typer.Argument(help="Baseline run folder or results directory (several runs = repeats; a sweep = per cell).")],
    candidate: Annotated[Path, typer.Argument(help="Candidate run folder or results directory, same layout.")],
    rule: Annotated[Optional[list[str]], typer.Option(
        "--rule", help="Rule, e.g. 'goodput >= -5%', 'p99_ttft <= +10%', 'attainment >= 0.95' (repeatable).")] = None,
    rules: Annotated[Out, typer.Option("--rules", help="TOML file with rules = [...].")] = None,
    slo: SloOpt = None,
    confidence: Annotated[float, typer.Option("--confidence", min=0.5, max=0.999, help=(
        "Family-wise confidence: with no real change the whole gate (all rules, all cases) fails with "
        "probability at most 1 - this."))] = 0.99,
    detect: Annotated[float, typer.Option("--detect", min=0.001, max=0.9, help=(
        "For the repeats column: the regression beyond a limit (0.05 = 5%) to be caught with 90% power."))] = 0.05,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap.")] = 0,
    md: Annotated[Out, typer.Option("--markdown", help="Write a Markdown summary (PR comment) here; - for stdout.")] = None,
    junit: Annotated[Out, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    json_out: Annotated[Out, typer.Option("--json", help="Write the full result as JSON here; - for stdout.")] = None,
    allow_different: Annotated[bool, typer.Option(
        "--allow-different-workloads",
        help="Decide even when the two sides' runs are of different workloads (refused by default).")] = False,
) -> None:
    """Compare CANDIDATE with BASELINE under the rules; exit 0 pass, 1 regression, 2 usage error.

    A rule fails only when the change is beyond its limit with family-wise confidence over all the rules (one joint bootstrap, runs of the same trace paired, step-down max-T); a change within noise is reported, not failed. The repeats column says how many runs a side would catch a regression --detect beyond the limit with 90% power.

    Example:

        llmlb gate results/main results/pr --slo ttft=500ms,tpot=50ms --rule 'goodput >= -5%' --rule 'p99_ttft <= +10%' --markdown gate.md --junit gate.xml
    """
    from llmlb_bench.gate import junit_xml, load_rules, markdown, parse_rule, run_gate, terminal_table, to_json

    parsed = [parse_rule(r) for r in rule or []] + (load_rules(rules) if rules else [])
    if not parsed:
        raise UserError("give at least one --rule or a --rules file", "--rule")
    slo_parsed = Slo.parse(slo)
    if slo_parsed is None and any(r.metric.name in ("attainment", "goodput") for r in parsed):
        raise UserError("attainment and goodput rules need an --slo", "--slo")
    out = run_gate([baseline], [candidate], parsed, slo_parsed, confidence, seed, detect=detect,
                   allow_different=allow_different)
    _write(md, markdown(out))
    _write(junit, junit_xml(out))
    _write(json_out, to_json(out))
    if "-" not in (str(md), str(json_out)):
        console.print(terminal_table(out))
    raise typer.Exit(out.exit_code)
