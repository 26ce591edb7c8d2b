"""The router suite's figures as a side-by-side Markdown report (one table per scenario)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from llmlb_bench.pypi_routers.bench import Cell


def _ms(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{1000 * v:+.1f}" if signed else f"{1000 * v:.1f}"


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _errors(kinds: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"


COLUMNS = ("router", "TTFT p50 / p99 ms", "added TTFT p50 / p99 ms", "E2E p50 / p99 ms", "added E2E p50 / p99 ms",
           "router CPU ms/req", "Jain (backends)", "hit rate delivered / offered", "SLO met", "goodput req/s",
           "same backend as llmlb replay / sim", "co-location agreement replay / sim", "errors the client saw")


def markdown(cells: Iterable[Cell], summaries: dict[str, str] | None = None) -> str:
    """One section per scenario, one row per router (``direct`` first)."""
    by: dict[str, list[Cell]] = {}
    for c in cells:
        by.setdefault(c["scenario"], []).append(c)
    out: list[str] = []
    for name, rows in by.items():
        out += [f"### {name}", ""]
        if summaries and name in summaries:
            out += [summaries[name], ""]
        out += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for c in rows:
            out.append("| " + " | ".join([
                c["router"],
                f"{_ms(c['ttft_p50_s'])} / {_ms(c['ttft_p99_s'])}",
                f"{_ms(c.get('added_ttft_p50_s'), True)} / {_ms(c.get('added_ttft_p99_s'), True)}",
                f"{_ms(c['e2e_p50_s'])} / {_ms(c['e2e_p99_s'])}",
                f"{_ms(c.get('added_e2e_p50_s'), True)} / {_ms(c.get('added_e2e_p99_s'), True)}",
                _f(c["cpu_ms_per_request"]),
                _f(c["jain_backends"], "{:.3f}"),
                f"{c['hit_rate_delivered']:.1%} / {c['hit_rate_offered']:.1%}",
                f"{c['slo_attainment']:.1%}",
                _f(c["goodput_rps"], "{:.1f}"),
                f"{_f(c.get('agreement_direct'), '{:.1%}')} / {_f(c.get('agreement_sim'), '{:.1%}')}",
                f"{_f(c.get('colocation_direct'), '{:.1%}')} / {_f(c.get('colocation_sim'), '{:.1%}')}",
                _errors(c["errors"]),
            ]) + " |")
        out.append("")
    return "\n".join(out)
