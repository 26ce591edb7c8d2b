"""Terminal tables of a sweep's outcome: capacities, then one stability table per workload x cluster.

Long format (one row per policy and rate) rather than one column per
policy: a sweep of six policies over ten rates still fits a terminal.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from rich.console import Console
from rich.table import Table


def _num(v: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if v is None else format(v * scale, spec)


def _ci(stat: dict[str, Any] | None, spec: str, scale: float = 1.0) -> str:
    if not stat or stat.get("mean") is None:
        return "-"
    text = _num(stat["mean"], spec, scale)
    if stat.get("low") is not None:
        text += f" ±{_num((stat['high'] - stat['low']) / 2, spec, scale)}"
    return text


def capacity_table(summary: dict[str, Any]) -> Table:
    target = summary["target"]
    t = Table(title=f"Capacity: highest rate with SLO attainment >= {100 * target:g}% ({summary['slo']})",
              title_justify="left")
    for col in ("workload", "cluster", "policy"):
        t.add_column(col)
    for col in ("capacity (req/s)", "95% CI", "seeds", "$/h", "requests per $"):
        t.add_column(col, justify="right")
    t.add_column("note")
    for r in summary["capacity"]:
        ci = "-" if r["low"] is None else f"{max(r['low'], 0):,.2f} - {r['high']:,.2f}"
        note = {"below": "misses the target at the lowest rate tried",
                "above": "meets it at the highest rate tried (lower bound)"}
        t.add_row(r["workload"], r["cluster"], r["policy"], _num(r["mean"], ",.2f"), ci, str(r["n"]),
                  _num(r["price_per_hour"], ",.2f"), _num(r["requests_per_usd"], ",.0f"),
                  "; ".join(note[c] for c in r["censored"]))
    return t


def curve_tables(summary: dict[str, Any]) -> list[Table]:
    axis = summary["axis"]
    slo = summary["slo"] is not None
    tables = []
    for (workload, cluster), curves in groupby(summary["curves"], key=lambda c: (c["workload"], c["cluster"])):
        t = Table(title=f"Stability: {workload} on {cluster}" + (f" (SLO {summary['slo']})" if slo else ""),
                  title_justify="left", caption="mean over seeds ± half the 95% interval", caption_justify="left")
        t.add_column("policy")
        t.add_column(axis, justify="right")
        t.add_column("req/s offered", justify="right")
        if slo:
            t.add_column("attainment %", justify="right")
            t.add_column("goodput req/s", justify="right")
        for col in ("TTFT p99 ms", "TPOT p99 ms", "E2E mean s"):
            t.add_column(col, justify="right")
        for curve in curves:
            for i, p in enumerate(curve["points"]):
                row = [curve["policy"] if i == 0 else "", f"{p['x']:g}", f"{p['rate']:,.2f}"]
                if slo:
                    row += [_ci(p.get("attainment"), ".1f", 100), _ci(p.get("goodput"), ",.2f")]
                row += [_ci(p.get("ttft.p99"), ",.0f", 1e3), _ci(p.get("tpot.p99"), ",.1f", 1e3),
                        _ci(p.get("e2e.mean"), ",.2f")]
                t.add_row(*row, end_section=i == len(curve["points"]) - 1)
        tables.append(t)
    return tables


def knee_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    for c in summary["curves"]:
        knee = c["knee"]
        best = c["max_goodput"]
        text = f"{c['workload']} / {c['cluster']} / [bold]{c['policy']}[/]: knee of {summary['knee_metric']} "
        text += f"at {summary['axis']} {knee['x']:g} ({knee['rate']:,.2f} req/s)" if knee else "not found"
        if best:
            text += (f"; capacity {best['rate']:,.2f} req/s offered at {summary['axis']} {best['x']:g} "
                     f"(goodput there {best['goodput']:,.2f} req/s, attainment {100 * best['attainment']:.1f}%)")
        else:
            text += f"; attainment below {100 * summary['target']:g}% at every rate"
        lines.append(text)
    return lines


def render(summary: dict[str, Any], console: Console) -> None:
    if summary["capacity"]:
        console.print(capacity_table(summary))
    if summary["curves"]:
        for table in curve_tables(summary):
            console.print(table)
        for line in knee_lines(summary):
            console.print(line)
