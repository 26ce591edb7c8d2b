"""The report as one self-contained HTML file: inline SVG figures and tables, no scripts, no network.

Every figure of :mod:`llmlb_bench.report.figures` is embedded as SVG markup
(matplotlib draws text as paths, so no font is fetched), followed by the
tables of :mod:`llmlb_bench.report.tables`. The file opens offline and can
be attached to a paper's artifact as it is.
"""

from __future__ import annotations

import html

from llmlb_bench import __version__
from llmlb_bench.report import tables
from llmlb_bench.report.shape import ReportDoc
from llmlb_bench.report.tables import Table
from llmlb_bench.report.verdict import verdict_lines

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       color: #1d1d1f; background: #fff; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #f5f5f7; position: sticky; top: 0; }
tr.section td { font-weight: 600; background: #fafafa; text-align: left; }
figure { margin: 1em 0 2em; } figcaption { color: #555; font-size: .9em; }
figure svg { max-width: 100%; height: auto; }
.note { color: #555; font-size: .9em; } .verdict { font-size: 1.1em; } .warn { color: #8a4b00; background: #fff6e5; padding: 2px 6px; } .scroll { overflow-x: auto; }
"""


def table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(h).replace(chr(10), '<br>')}</th>" for h in t.header)
    rows = []
    for i, row in enumerate(t.rows):
        if i in t.sections:
            rows.append(f'<tr class="section"><td colspan="{len(t.header)}">{html.escape(row[0])}</td></tr>')
        else:
            rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    note = f'<p class="note">{html.escape(t.note)}</p>' if t.note else ""
    return (f"<h2>{html.escape(t.title)}</h2><div class=\"scroll\"><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></div>{note}")


def render(doc: ReportDoc, figs: list[tuple[str, str, str]]) -> str:
    """The whole page; ``figs`` are :func:`llmlb_bench.report.figures.render`'s ``(stem, caption, svg)``."""
    opts = doc["options"]
    subtitle = f"{len(doc['runs'])} run(s), {opts['definitions']} definitions"
    if opts["slo_text"]:
        subtitle += f", SLO {opts['slo_text']}"
    body = [f"<h1>llmlb report</h1><p class=\"note\">{html.escape(subtitle)} · llmlb-bench {__version__}</p>"]
    body += [f'<p class="verdict"><b>Verdict:</b> {html.escape(line)}</p>' for line in verdict_lines(doc)]
    body += [f'<p class="warn">note: {html.escape(n)}</p>' for n in doc.get("notes") or ()]
    all_tables = tables.all_tables(doc)
    body.append(table_html(all_tables[0]))
    body.append("<h2>Figures</h2>")
    for stem, caption, svg in figs:
        body.append(f'<figure id="{html.escape(stem)}">{svg}<figcaption>{html.escape(caption)}</figcaption></figure>')
    body += [table_html(t) for t in all_tables[1:]]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>llmlb report</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
