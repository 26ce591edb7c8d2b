"""The report in a terminal: Rich tables.

The comparison (one row per run) is printed as it is when it fits the
console, else transposed like the details. The details table puts runs side by side (one column per run) so a policy
comparison reads left to right; with more runs than fit the console's
width it is split into several tables of as many runs as fit, each
repeating the figure column, rather than squeezing every column unreadable.
"""

from __future__ import annotations


from rich.console import Console
from rich.markup import escape

from llmlb_bench.console import Table as RichTable
from llmlb_bench.report import tables
from llmlb_bench.report.shape import ReportDoc
from llmlb_bench.report.tables import Table
from llmlb_bench.report.verdict import verdict_lines

FIGURE_WIDTH = 42
RUN_WIDTH = 18


def rich_table(t: Table, title: str | None = None) -> RichTable:
    out = RichTable(title=title or t.title, header_style="bold", title_justify="left", caption=t.note,
                    caption_justify="left")
    for i, h in enumerate(t.header):
        out.add_column(h, justify="left" if i == 0 else "right", no_wrap=i == 0, overflow="fold")
    for i, row in enumerate(t.rows):
        if i in t.sections:
            out.add_row(f"[bold]{row[0]}[/]", *[""] * (len(row) - 1))
        else:
            out.add_row(("  " if t.sections else "") + row[0], *row[1:])
    return out


def _text_table(t: Table, numeric: tuple[str, ...] = ("requests",)) -> RichTable:
    """A table of text (error messages): cells are not markup, text is left-aligned (``numeric`` columns
    right-aligned), and the last column takes the width left and wraps."""
    out = RichTable(title=t.title, header_style="bold", title_justify="left")
    for i, h in enumerate(t.header):
        out.add_column(h, justify="right" if h in numeric else "left", overflow="fold",
                       ratio=1 if i == len(t.header) - 1 else None)
    for row in t.rows:
        out.add_row(*map(escape, row))
    return out


def _width(t: Table) -> int:
    """Columns a table needs unwrapped: each column's widest line plus borders and padding."""
    cols = zip(*([t.header] + t.rows))
    return 1 + sum(3 + max(len(line) for cell in col for line in cell.split("\n")) for col in cols)


def _print_fitting(console: Console, t: Table) -> None:
    """``t`` as it is when it fits the console; else transposed (one row per column, one column per run),
    split into as many tables as it takes, each repeating the figure column."""
    if _width(t) <= console.width:
        console.print(rich_table(t))
        return
    flipped = tables.transpose(t)
    if not flipped.header[1:]:
        console.print(rich_table(t))
        return
    first = max(len(r[0]) for r in flipped.rows) + 3
    per_table = max(1, (console.width - first - 1) // RUN_WIDTH)
    names = flipped.header[1:]
    for k in range(0, len(names), per_table):
        part = Table(flipped.title if len(names) <= per_table else
                     f"{flipped.title} (runs {k + 1}-{min(k + per_table, len(names))} of {len(names)})",
                     [flipped.header[0]] + names[k:k + per_table],
                     [[r[0]] + r[1 + k:1 + k + per_table] for r in flipped.rows],
                     note=flipped.note if k + per_table >= len(names) else None)
        console.print(rich_table(part))


def render(doc: ReportDoc, console: Console) -> None:
    """Print every table of the report, its notes and verdicts on top."""
    slo = doc["options"]["slo_text"]
    console.print(f"[bold]llmlb report[/] — {len(doc['runs'])} run(s), {doc['options']['definitions']} definitions"
                  + (f", SLO {slo}" if slo else ""))
    for note in doc.get("notes") or ():
        console.print(f"[yellow]note:[/] {escape(note)}")
    for line in verdict_lines(doc):
        console.print(f"[bold]verdict:[/] {escape(line)}")
    _print_fitting(console, tables.comparison(doc))
    failed = tables.failures(doc)
    if failed is not None:
        console.print(_text_table(failed))
    for t in tables.verdict_tables(doc):
        console.print(rich_table(t))
    for group in (tables.groups(doc, key) for key in tables.GROUP_TABLES):
        if group is not None:
            console.print(rich_table(group))
    for t in tables.curves(doc):
        _print_fitting(console, t)
    per_table = max(1, (console.width - FIGURE_WIDTH) // RUN_WIDTH)
    runs = doc["runs"]
    for k in range(0, len(runs), per_table):
        chunk = runs[k:k + per_table]
        title = "Details" if len(runs) <= per_table else f"Details (runs {k + 1}-{k + len(chunk)} of {len(runs)})"
        console.print(rich_table(tables.details(doc, chunk), title))

