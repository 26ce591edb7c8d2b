"""Rich comparison table: one column per run, one row per figure.

Runs side by side (rather than one row per run) keep the table narrow
enough for a terminal however many percentiles are shown, and make the
policy comparison read left to right.
"""

from __future__ import annotations

from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from llmlb_bench.metrics.distribution import PERCENTILES, pkey

Row = tuple[str, Callable[[dict[str, Any]], Any], str]


def _fmt(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    return format(value, spec)


def _rows(slo: bool) -> list[tuple[str, list[Row]]]:
    def lat(name: str, scale: float, unit: str) -> list[Row]:
        stats = ["mean", *(pkey(p) for p in PERCENTILES)]
        return [(f"{name} {st} ({unit})",
                 (lambda s, n=name.lower(), st=st: None if s[n][st] is None else s[n][st] * scale), ",.1f")
                for st in stats]

    sections = [
        ("Requests", [
            ("total", lambda s: s["requests"], ",d"),
            ("ok", lambda s: s["ok"], ",d"),
            ("failed (error/timeout/rejected/not sent)",
             lambda s: s["error"] + s["timeout"] + s["rejected"] + s["not_sent"], ",d"),
            ("preemptions", lambda s: s["preemptions"], ",d"),
            ("prefix-cached input (%)",
             lambda s: 100 * s["cached_tokens"] / s["input_tokens"] if s["input_tokens"] else None, ".1f"),
        ]),
        ("Throughput", [
            ("duration (s)", lambda s: s["duration_s"], ",.1f"),
            ("requests/s", lambda s: s["request_throughput"], ",.2f"),
            ("output tokens/s", lambda s: s["output_throughput"], ",.0f"),
        ]),
        ("Latency", lat("TTFT", 1e3, "ms") + lat("TPOT", 1e3, "ms") + lat("ITL", 1e3, "ms") + lat("E2E", 1.0, "s")),
    ]
    if slo:
        sections.append(("SLO", [
            ("attainment (%)", lambda s: 100 * s["slo"]["attainment"] if s["slo"]["attainment"] is not None else None, ".1f"),
            ("goodput (requests/s)", lambda s: s["slo"]["goodput"], ",.2f"),
            ("good output tokens/s", lambda s: s["slo"]["good_token_throughput"], ",.0f"),
        ]))
    return sections


def run_title(s: dict[str, Any]) -> str:
    return s["label"] or s["run_id"]


def render(summaries: list[dict[str, Any]], console: Console, slo_text: str | None = None) -> None:
    """Print the comparison table (and a note on partial runs)."""
    title = "llmlb report" + (f" — SLO {slo_text}" if slo_text else "")
    table = Table(title=title, show_lines=False, header_style="bold")
    table.add_column("figure")
    for s in summaries:
        table.add_column(run_title(s), justify="right")
    for section, rows in _rows(slo=any("slo" in s for s in summaries)):
        table.add_row(f"[bold]{section}[/]", *[""] * len(summaries))
        for label, get, spec in rows:
            table.add_row("  " + label, *[_fmt(get(s), spec) for s in summaries])
    console.print(table)
    for s in summaries:
        if s["status"] != "complete":
            console.print(f"[yellow]note:[/] run {s['run_id']} is {s['status']}; its figures cover the rows it stored")
