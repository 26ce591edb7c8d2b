"""Line charts as inline SVG markup, without matplotlib: what an HTML page needs from the basic install.

Deterministic text (same data, same bytes), a few kilobytes per chart, no
fonts fetched (the page's own font draws the labels), no scripts.
"""

from __future__ import annotations

import html
import math
from typing import Callable, Sequence

from llmlb_bench.metrics.run_figures import CurvePoint, LatencyName
from llmlb_bench.report.shape import ReportDoc

#: a colour-blind-safe cycle (Okabe-Ito)
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 320, 64, 170, 28, 44

Series = tuple[str, Sequence[float], Sequence[float | None]]


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _label(v: float) -> str:
    return f"{v:,.4g}"


def line_chart(title: str, series: Sequence[Series], xlabel: str, ylabel: str) -> str:
    """One chart: a line with markers per series (points with a None value are skipped)."""
    pts = [(x, y) for _, xs, ys in series for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = min(0.0, min(p[1] for p in pts)), max(p[1] for p in pts)
    if x1 == x0:
        x0, x1 = x0 - 0.5, x1 + 0.5
    if y1 == y0:
        y1 = y0 + 1.0
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return TOP + ph - (y - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
           f'role="img" aria-label="{html.escape(title)}" font-size="11">',
           f'<text x="{LEFT}" y="16" font-weight="bold">{html.escape(title)}</text>']
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#e5e5e5"/>'
                   f'<text x="{LEFT - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{_label(t)}</text>')
    for t in _ticks(x0, x1):
        out.append(f'<text x="{sx(t):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{_label(t)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 8}" text-anchor="middle">{html.escape(xlabel)}</text>')
    out.append(f'<text x="14" y="{TOP + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 14 {TOP + ph / 2})">{html.escape(ylabel)}</text>')
    for i, (name, xs, ys) in enumerate(series):
        c = COLOURS[i % len(COLOURS)]
        xy = [(sx(x), sy(y)) for x, y in zip(xs, ys) if y is not None and math.isfinite(y)]
        if not xy:
            continue
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.6" points="'
                   + " ".join(f"{a:.1f},{b:.1f}" for a, b in xy) + '"/>')
        out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{c}"/>' for a, b in xy]
        ly = TOP + 12 + 16 * i
        out.append(f'<line x1="{W - RIGHT + 10}" x2="{W - RIGHT + 28}" y1="{ly - 4}" y2="{ly - 4}" stroke="{c}" '
                   f'stroke-width="2"/><text x="{W - RIGHT + 32}" y="{ly}">{html.escape(name[:26])}</text>')
    out.append("</svg>")
    return "".join(out)


def report_figures(doc: ReportDoc) -> list[tuple[str, str, str]]:
    """The HTML report's figures without matplotlib: latency CDFs of TTFT and E2E (one line per run)
    and each load curve's goodput and E2E p99 against the offered rate; ``(stem, caption, svg)``."""
    from llmlb_bench.metrics.distribution import CDF_PROBABILITIES
    from llmlb_bench.report.tables import run_name

    out = []
    cdfs: tuple[tuple[LatencyName, str, str, float], ...] = (("ttft", "TTFT", "ms", 1e3), ("e2e", "E2E", "s", 1.0))
    for fig, label, unit, scale in cdfs:
        series = [(run_name(s), [v * scale for v in (s.get(fig) or {}).get("cdf") or []],
                   [100 * p for p in CDF_PROBABILITIES]) for s in doc["runs"] if (s.get(fig) or {}).get("cdf")]
        series = [(n, xs, ys) for n, xs, ys in series if xs]
        chart = line_chart(f"{label} CDF", series, f"{label} ({unit})", "% of requests") if series else ""
        if chart:
            out.append((f"cdf_{fig}", f"{label}: share of ok requests at or below each latency", chart))
    for c in doc["curves"]:
        rates = [p["rate"] for p in c["points"]]
        figs: tuple[tuple[str, str, str, Callable[[CurvePoint], float | None]], ...] = (
            ("goodput", "Goodput", "req/s", lambda p: p.get("goodput")),
            ("e2e_p99", "E2E p99", "s", lambda p: (p.get("e2e") or {}).get("p99")))
        for key, label, unit, get in figs:
            chart = line_chart(f"{label}: {c['name']}", [(c["name"], rates, [get(p) for p in c["points"]])],
                               "offered req/s", unit)
            if chart:
                out.append((f"load_{key}", f"{label} against offered load: {c['name']}", chart))
    return out
