"""``llmlb policies``: list the built-in routing policies and engine schedulers with their parameters."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.console import Table
from llmlb_bench.tomlfile import unknown_choice

if TYPE_CHECKING:  # the command imports the policies when it runs (start-up time)
    from llmlb_bench.policies import Policy
    from llmlb_bench.policies.schedulers import EngineScheduler

#: the family under which ``llmlb policies`` lists engine-level schedulers (``--scheduler``)
ENGINE_FAMILY = "engine (--scheduler)"


def _describe(cls: type[Policy] | type[EngineScheduler]) -> dict[str, object]:
    return {"name": cls.name, "summary": cls.summary,
            "params": {k: {"default": d, "meaning": doc} for k, (d, doc) in cls.params.items()}}


@app.command()
def policies(
    name: Annotated[Optional[str], typer.Argument(help="Show only this policy.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (name, summary, params) instead of a table.")] = False,
) -> None:
    """List routing policies by family, and engine-level schedulers, with a one-line description and their parameters.

    Use a routing policy with --policy NAME --policy-arg key=value (repeat --policy-arg for
    several), or your own class with --policy package.module:ClassName; an engine
    scheduler (the order inside each simulated replica) with --scheduler NAME
    --scheduler-arg key=value. docs/policies.md describes each one and its source.

    Example:

        llmlb policies

        llmlb policies cache_aware --json
    """
    from llmlb_bench.policies import FAMILIES
    from llmlb_bench.policies.schedulers import ENGINE_SCHEDULERS

    families: dict[str, tuple[type[Policy] | type[EngineScheduler], ...]] = {
        **FAMILIES, ENGINE_FAMILY: tuple(ENGINE_SCHEDULERS.values())}
    known = sorted({c.name for classes in families.values() for c in classes})
    if name is not None and name not in known:
        raise unknown_choice("policy", name, known, "policies")
    groups = {fam: [c for c in classes if name is None or c.name == name] for fam, classes in families.items()}
    groups = {fam: classes for fam, classes in groups.items() if classes}
    if as_json:
        out = [dict(_describe(c), family=fam) for fam, classes in groups.items() for c in classes]
        typer.echo(json.dumps(out if name is None else out[0], indent=2))
        return
    table = Table(header_style="bold")
    table.add_column("family")
    table.add_column("policy")
    table.add_column("what it does")
    table.add_column("parameters (default): meaning")
    for fam, classes in groups.items():
        for i, cls in enumerate(classes):
            params = "\n".join(f"{k}={d!r}: {doc}" for k, (d, doc) in cls.params.items()) or "-"
            table.add_row(fam if i == 0 else "", cls.name, cls.summary, params, end_section=i == len(classes) - 1)
    console.print(table)
