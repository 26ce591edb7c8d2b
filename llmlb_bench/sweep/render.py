"""A sweep's outcome as tables and charts: capacities, one stability table per workload x cluster, knees.

Long format (one row per policy and rate) rather than one column per
policy: a sweep of six policies over ten rates still fits a terminal. The
tables are the report's plain models (:class:`llmlb_bench.report.tables.Table`),
so the terminal, Markdown and HTML show the same cells; the HTML adds one
inline-SVG chart per figure against load (no matplotlib needed).
"""

from __future__ import annotations

import html
from itertools import groupby
from typing import TYPE_CHECKING, Mapping

from rich.console import Console
from rich.markup import escape

from llmlb_bench import __version__
from llmlb_bench.report import svg
from llmlb_bench.report.html import CSS, table_html
from llmlb_bench.report.markdown import table_md
from llmlb_bench.report.tables import Table
from llmlb_bench.report.terminal import rich_table

if TYPE_CHECKING:   # the sweep's modules are not needed to render its summary
    from llmlb_bench.sweep.curves import CurvePoint
    from llmlb_bench.sweep.runner import SweepSummary


def _num(v: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if v is None else format(v * scale, spec)


def _stat(p: CurvePoint, fig: str) -> Mapping[str, float | None]:
    """A figure's mean and interval at a point (sweep.stats.MeanCi), empty where the point has none."""
    stat = p.get(fig)
    return stat if isinstance(stat, Mapping) else {}


def _mean(p: CurvePoint, fig: str, scale: float = 1.0) -> float | None:
    mean = _stat(p, fig).get("mean")
    return None if mean is None else mean * scale


def _ci(stat: Mapping[str, float | None], spec: str, scale: float = 1.0) -> str:
    mean, low, high = stat.get("mean"), stat.get("low"), stat.get("high")
    if mean is None:
        return "-"
    text = _num(mean, spec, scale)
    if low is not None and high is not None:
        text += f" ±{_num((high - low) / 2, spec, scale)}"
    return text


def _x(p: CurvePoint) -> float:
    x = p["x"]
    assert isinstance(x, (int, float)), x   # the axis value curves.stability_curves wrote
    return x


def capacity_table(summary: SweepSummary) -> Table:
    target = summary["target"]
    t = Table(f"Capacity: highest rate with SLO attainment >= {100 * target:g}% ({summary['slo']})",
              ["workload", "cluster", "policy", "capacity\nreq/s", "95% CI", "seeds", "$/h", "requests\nper $",
               "note"])
    note = {"below": "misses the target at the lowest rate tried",
            "above": "meets it at the highest rate tried (lower bound)"}
    for r in summary["capacity"]:
        low = r["low"]
        ci = "-" if low is None else f"{max(low, 0):,.2f} - {r['high']:,.2f}"
        t.rows.append([r["workload"], r["cluster"], r["policy"], _num(r["mean"], ",.2f"), ci, str(r["n"]),
                       _num(r["price_per_hour"], ",.2f"), _num(r["requests_per_usd"], ",.0f"),
                       "; ".join(note[c] for c in r["censored"])])
    return t


def curve_tables(summary: SweepSummary) -> list[Table]:
    axis = summary["axis"]
    slo = summary["slo"] is not None
    tables = []
    for (workload, cluster), curves in groupby(summary["curves"], key=lambda c: (c["workload"], c["cluster"])):
        header = ["policy", str(axis), "offered\nnominal", "offered\nrealised"] \
            + (["attain\n%", "goodput\nreq/s"] if slo else []) + ["TTFT p99\nms", "TPOT p99\nms", "E2E mean\ns"]
        t = Table(f"Stability: {workload} on {cluster}" + (f" (SLO {summary['slo']})" if slo else ""), header,
                  note="mean over seeds ± half the 95% interval; offered, req/s: nominal = the spec's mean rate x "
                       "its rate scale, realised = requests / arrival window of the trace run, the window "
                       "throughput and goodput are per second of (so goodput <= realised)")
        for curve in curves:
            for i, p in enumerate(curve["points"]):
                row = [curve["policy"] if i == 0 else "", f"{p['x']:g}", f"{p['rate']:,.2f}",
                       _ci(_stat(p, "realised_rate"), ",.2f")]
                if slo:
                    row += [_ci(_stat(p, "attainment"), ".1f", 100), _ci(_stat(p, "goodput"), ",.2f")]
                row += [_ci(_stat(p, "ttft.p99"), ",.0f", 1e3), _ci(_stat(p, "tpot.p99"), ",.1f", 1e3),
                        _ci(_stat(p, "e2e.mean"), ",.2f")]
                t.rows.append(row)
        tables.append(t)
    return tables


def knee_lines(summary: SweepSummary) -> list[str]:
    lines = []
    for c in summary["curves"]:
        knee = c["knee"]
        best = c["max_goodput"]
        text = f"{c['workload']} / {c['cluster']} / {c['policy']}: knee of {summary['knee_metric']} "
        text += f"at {summary['axis']} {knee['x']:g} ({knee['rate']:,.2f} req/s)" if knee else "not found"
        if best:
            text += (f"; capacity {best['rate']:,.2f} req/s offered (nominal) at {summary['axis']} {best['x']:g} "
                     f"(goodput there {best['goodput']:,.2f} req/s, attainment {100 * best['attainment']:.1f}%)")
        else:
            text += f"; attainment below {100 * summary['target']:g}% at every rate"
        lines.append(text)
    return lines


#: what each robustness knob is, as an axis label
KNOB_LABELS = {"signal_refresh_s": "signal refresh interval (s)", "tau": "predictor Kendall tau",
               "slowdown": "slowdown factor of one replica"}


def robustness_tables(summary: SweepSummary) -> list[Table]:
    """One table per knob: goodput, attainment and TTFT p99 of each policy as the knob moves."""
    slo = summary["slo"] is not None
    tables = []
    for knob, curves in groupby(summary.get("robustness") or [], key=lambda c: c["knob"]):
        header = ["workload", "cluster", "policy", knob] + (["attain\n%", "goodput\nreq/s"] if slo else []) \
            + ["TTFT p99\nms", "E2E mean\ns"]
        t = Table(f"Robustness: {KNOB_LABELS[knob]}", header, note="mean over seeds ± half the 95% interval")
        for c in curves:
            for i, p in enumerate(c["points"]):
                row = [c["workload"], c["cluster"], c["policy"]] if i == 0 else ["", "", ""]
                row.append(f"{p['x']:g}")
                if slo:
                    row += [_ci(_stat(p, "attainment"), ".1f", 100), _ci(_stat(p, "goodput"), ",.2f")]
                row += [_ci(_stat(p, "ttft.p99"), ",.0f", 1e3), _ci(_stat(p, "e2e.mean"), ",.2f")]
                t.rows.append(row)
        tables.append(t)
    return tables


def robustness_charts(summary: SweepSummary) -> list[tuple[str, str]]:
    """``(stem, svg)``: goodput (with an SLO) and TTFT p99 against each knob, a line per policy."""
    out = []
    figs = ((("goodput", "Goodput", "req/s", 1.0),) if summary["slo"] is not None else ()) + (
        ("ttft.p99", "TTFT p99", "ms", 1e3),)
    for (knob, workload, cluster), group in groupby(summary.get("robustness") or [],
                                                    key=lambda c: (c["knob"], c["workload"], c["cluster"])):
        curves = list(group)
        for fig, title, unit, scale in figs:
            series = [(c["policy"], [_x(p) for p in c["points"]], [_mean(p, fig, scale) for p in c["points"]])
                      for c in curves]
            chart = svg.line_chart(f"{title}: {workload} on {cluster}", series, KNOB_LABELS[knob], unit)
            if chart:
                out.append((f"{knob}.{fig.replace('.', '_')}.{workload}.{cluster}", chart))
    return out


def _tables(summary: SweepSummary) -> list[Table]:
    return (([capacity_table(summary)] if summary["capacity"] else []) + curve_tables(summary)
            + robustness_tables(summary))


def render(summary: SweepSummary, console: Console) -> None:
    for t in _tables(summary):
        console.print(rich_table(t))
    for line in knee_lines(summary):
        console.print(escape(line))


def render_markdown(summary: SweepSummary) -> str:
    parts = [f"### llmlb sweep {summary.get('sweep', '')}"]
    parts += [table_md(t) for t in _tables(summary)]
    parts += [f"- {line}" for line in knee_lines(summary)]
    return "\n\n".join(parts) + "\n"


#: (point figure, chart title, y label, scale)
CHARTS = (("attainment", "SLO attainment", "%", 100.0), ("goodput", "Goodput", "req/s", 1.0),
          ("ttft.p99", "TTFT p99", "ms", 1e3), ("e2e.mean", "Mean E2E", "s", 1.0))


def charts(summary: SweepSummary) -> list[str]:
    """One inline SVG per figure and workload x cluster: a line per policy against the sweep's axis."""
    out = []
    for (workload, cluster), group in groupby(summary["curves"], key=lambda c: (c["workload"], c["cluster"])):
        curves = list(group)
        for fig, title, unit, scale in CHARTS:
            series = [(c["policy"], [_x(p) for p in c["points"]], [_mean(p, fig, scale) for p in c["points"]])
                      for c in curves]
            chart = svg.line_chart(f"{title}: {workload} on {cluster}", series, str(summary["axis"]), unit)
            if chart:
                out.append(chart)
    return out + [chart for _, chart in robustness_charts(summary)]


def render_html(summary: SweepSummary) -> str:
    """A self-contained page: tables, knees and capacities, and the curves as inline SVG."""
    body = [f"<h1>llmlb sweep {html.escape(str(summary.get('sweep', '')))}</h1>"
            f"<p class=\"note\">llmlb-bench {__version__}</p>"]
    body += [f"<figure>{c}</figure>" for c in charts(summary)]
    body += [table_html(t) for t in _tables(summary)]
    body += ["<ul>"] + [f"<li>{html.escape(line)}</li>" for line in knee_lines(summary)] + ["</ul>"]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>llmlb sweep</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
