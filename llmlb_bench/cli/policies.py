"""``llmlb policies``: list the built-in routing policies and their parameters."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.table import Table

from llmlb_bench.cli.app import app, console
from llmlb_bench.errors import UserError
from llmlb_bench.policies import BUILTIN, FAMILIES


def _describe(cls) -> dict:
    return {"name": cls.name, "summary": cls.summary,
            "params": {k: {"default": d, "meaning": doc} for k, (d, doc) in cls.params.items()}}


@app.command()
def policies(
    name: Annotated[Optional[str], typer.Argument(help="Show only this policy.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (name, summary, params) instead of a table.")] = False,
) -> None:
    """List routing policies by family with a one-line description and their parameters.

    Use one with --policy NAME --policy-arg key=value (repeat --policy-arg for
    several), or your own class with --policy package.module:ClassName.
    docs/policies.md describes each policy and its source.

    Example:

        llmlb policies

        llmlb policies cache_aware --json
    """
    if name is not None and name not in BUILTIN:
        raise UserError(f"unknown policy {name!r} (known: {', '.join(sorted(BUILTIN))})", "policies")
    groups = {fam: [c for c in classes if name is None or c.name == name] for fam, classes in FAMILIES.items()}
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
