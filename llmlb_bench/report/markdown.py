"""The report as GitHub-flavoured Markdown, for a pull-request comment.

The comparison table (and per-class, per-tenant and load tables) come
first; the long details table sits in a collapsed ``<details>`` block so the
comment stays short.
"""

from __future__ import annotations


from llmlb_bench.report import tables
from llmlb_bench.report.shape import ReportDoc
from llmlb_bench.report.tables import Table
from llmlb_bench.report.verdict import verdict_lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table_md(t: Table) -> str:
    lines = [f"**{t.title}**", "", "| " + " | ".join(_cell(h) for h in t.header) + " |",
             "|" + "|".join([":---"] + ["---:"] * (len(t.header) - 1)) + "|"]
    for i, row in enumerate(t.rows):
        cells = [f"**{_cell(row[0])}**" if i in t.sections else _cell(row[0])] + [_cell(c) for c in row[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    if t.note:
        lines += ["", f"_{_cell(t.note)}_"]
    return "\n".join(lines)


def render(doc: ReportDoc) -> str:
    opts = doc["options"]
    head = f"### llmlb report — {len(doc['runs'])} run(s), {opts['definitions']} definitions"
    if opts["slo_text"]:
        head += f", SLO `{opts['slo_text']}`"
    parts = [head] + [f"> Note: {_cell(n)}" for n in doc.get("notes") or ()]
    parts += [f"**Verdict:** {_cell(line)}" for line in verdict_lines(doc)]
    parts.append(table_md(tables.comparison(doc)))
    parts += [table_md(t) for t in (tables.failures(doc),) if t is not None]
    parts += [table_md(t) for t in tables.verdict_tables(doc)]
    parts += [table_md(t) for t in (tables.groups(doc, key) for key in tables.GROUP_TABLES) if t is not None]
    parts += [table_md(t) for t in tables.curves(doc)]
    parts.append("<details><summary>All figures</summary>\n\n" + table_md(tables.details(doc)) + "\n\n</details>")

    return "\n\n".join(parts) + "\n"
