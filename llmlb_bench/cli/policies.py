"""``llmlb policies``: list the built-in routing policies and their parameters."""

from __future__ import annotations

from rich.table import Table

from llmlb_bench.cli.app import app, console
from llmlb_bench.policies import BUILTIN


@app.command()
def policies() -> None:
    """List routing policies with a one-line description and their parameters.

    Use one with --policy NAME --policy-arg key=value, or your own class with
    --policy package.module:ClassName.

    Example:

        llmlb policies
    """
    table = Table(header_style="bold")
    table.add_column("policy")
    table.add_column("what it does")
    table.add_column("parameters (default)")
    for name, cls in sorted(BUILTIN.items()):
        params = "\n".join(f"{k}={d!r}: {doc}" for k, (d, doc) in cls.params.items()) or "-"
        table.add_row(name, cls.summary, params)
    console.print(table)
