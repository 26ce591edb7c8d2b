"""Build the report of some run folders and write it in one format (``llmlb report``, and the end of
``simulate``, ``run`` and ``replay``).

Lives with the renderers rather than in the CLI so every command that ends
with a report shares one code path, and the CLI modules only parse options.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from llmlb_bench.console import file_console, stderr_console, stdout_console
from llmlb_bench.errors import UserError
from llmlb_bench.metrics.identity import facets, names
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, metas_of
from llmlb_bench.progress import working
from llmlb_bench.report import figures, html, markdown, svg, terminal
from llmlb_bench.report.baseline import named, pick_baseline
from llmlb_bench.report.document import ReportOptions, build, to_json
from llmlb_bench.report.figdata import figure_data
from llmlb_bench.store.run import write_text_atomic
from llmlb_bench.store.views import Catalog

#: the formats :func:`print_report` writes (``cli.common.ReportFormat`` has the same values)
FORMATS = ("terminal", "json", "md", "html")


def _write(text: str, output: Path | None) -> None:
    """To stdout, or atomically to ``output`` (a failed report leaves no half-written file)."""
    if output is None:
        sys.stdout.write(text)
        return
    if output.is_dir():
        raise UserError("is a directory, expected a file name", output)
    write_text_atomic(output, text)


def check_baseline(cat: Catalog, name: str) -> None:
    """A --baseline that names no run fails before any figure is computed, not after (the report's
    verdicts match it the same way: run id, name, label, policy or folder; report.baseline)."""
    rows = cat.runs_table.select(["run_id", "label", "policy"]).to_pylist()
    metas = metas_of(cat.runs_table)
    shown = names({r["run_id"]: facets(metas[r["run_id"]]) for r in rows},
                  {r["run_id"]: r["label"] or r["run_id"] for r in rows})
    runs = [{**r, "name": shown[r["run_id"]]} for r in rows]
    if not any(pick_baseline([s], name) for s in runs):
        named(runs, name)  # the one-line error listing the runs


def print_report(paths: list[Path], slo_text: str | None, fmt: str, *,
                 options: Options | None = None, target: float = 0.9, output: Path | None = None,
                 figures_dir: Path | None = None, console: Console | None = None,
                 baseline: str | None = None) -> None:
    """Build the report of the runs under ``paths`` and render it as ``fmt`` (one of :data:`FORMATS`)."""
    fmt = str(getattr(fmt, "value", fmt))
    slo = Slo.parse(slo_text)
    drawn = fmt == "html" or figures_dir is not None
    # figure files need matplotlib; an HTML page without it gets inline-SVG charts (report.svg)
    with_matplotlib = figures_dir is not None or figures.available()
    if figures_dir is not None:
        figures.require()
    err = stderr_console()
    with working(err, "report: reading the runs and computing every figure"):
        cat = Catalog(paths)
        if baseline is not None:
            check_baseline(cat, baseline)
        summary = replace(options or Options(), cdf=drawn)
        doc = build(cat, ReportOptions(slo=slo, summary=summary, target=target, baseline=baseline),
                    ", ".join(map(str, paths)))
    with working(err, f"report: drawing the figures of {len(doc['runs'])} run(s)") if drawn else nullcontext():
        if not drawn:
            figs = []
        elif with_matplotlib:
            figs = figures.render(doc, figure_data(cat, doc), figures_dir)
        else:
            figs = svg.report_figures(doc)
    if fmt == "json":
        _write(to_json(doc), output)
    elif fmt == "md":
        _write(markdown.render(doc), output)
    elif fmt == "html":
        _write(html.render(doc, figs), output)
    elif output is None:
        terminal.render(doc, console or stdout_console())
    else:
        out = file_console()
        terminal.render(doc, out)
        _write(out.export_text(), output)
    if figures_dir is not None:
        err.print(f"figures: {len(figs)} x {', '.join(figures.FORMATS)} -> {figures_dir}")
    for d in doc["left_out"]:
        err.print(f"[bold yellow]warning:[/] {escape(d['why'])}", highlight=False, soft_wrap=True)
    named = {Path(p).resolve() for p in paths}
    for d in doc["left_out"]:
        if Path(d["dir"]).resolve() in named:
            raise UserError(f"run {d['run_id']} was named but left out of the report: {d['why'].split(': ', 1)[1]}",
                            d["dir"])
