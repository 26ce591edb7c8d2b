"""``llmlb query``: read-only SQL over every run in a results directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmlb_bench.cli.app import app, console
from llmlb_bench.cli.common import ResultsDir, TableFormat
from llmlb_bench.console import Table
from llmlb_bench.errors import UserError

if TYPE_CHECKING:
    import pyarrow as pa


@app.command()
def query(
    sql: Annotated[str, typer.Argument(help="One SELECT statement over the views requests, runs, series, cache_accounting.")],
    results: ResultsDir = Path("results"),
    fmt: Annotated[TableFormat, typer.Option("--format", "-f", help="Output format.")] = TableFormat.table,
    limit: Annotated[int, typer.Option("--limit", help="Most rows to print as a table (csv/json print all).")] = 200,
) -> None:
    """Run read-only SQL (DuckDB) over all runs under --results.

    Views: requests (one row per request, all runs), runs (one row per run,
    from run.json; the full document in column meta, typed JSON: meta.config.policy.name),
    series (per-target samples),
    cache_accounting (per request, where its prefix-cache hits went; runs whose
    trace has prefix hashes; docs/prefix-cache.md).

    Example:

        llmlb query "select run_id, count(*), avg(first_token_s - sent_s) from requests group by 1"

        llmlb query "select run_id, meta.config.policy.name as policy, meta->>'$.config.seed' as seed from runs"
    """
    import pyarrow.csv as pacsv

    from llmlb_bench.store.views import Catalog

    catalog = Catalog([results], confined=True)
    if not catalog.run_dirs:  # an empty answer would read as 'no requests', not 'wrong folder'
        raise UserError("no runs here (no run.json in it or below it)", results)
    table = catalog.query_read_only(sql)
    if fmt is TableFormat.csv:
        pacsv.write_csv(_flatten(table), sys.stdout.buffer)
    elif fmt is TableFormat.json:
        sys.stdout.write(json.dumps(table.to_pylist(), default=str) + "\n")
    else:
        out = Table(show_header=True, header_style="bold")
        for name in table.column_names:
            out.add_column(name)
        for row in table.slice(0, limit).to_pylist():
            out.add_row(*[_cell(v) for v in row.values()])
        console.print(out)
        if table.num_rows > limit:
            console.print(f"[dim]{table.num_rows - limit} more rows (use --limit or --format csv)[/]")


def _cell(v: object) -> str:
    if v is None:
        return "[dim]null[/]"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _flatten(table: pa.Table) -> pa.Table:
    """CSV cannot hold nested values: write lists and structs as JSON text."""
    import pyarrow as pa

    cols = []
    for col in table.columns:
        if pa.types.is_nested(col.type):
            col = pa.array([None if v is None else json.dumps(v, default=str) for v in col.to_pylist()], pa.string())
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)
