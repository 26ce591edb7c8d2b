"""Plots of a trace's characterisation as standalone SVG files (no plotting library needed).

Three pictures say more than the table: the request rate over time (load
shape, bursts, diurnal swing), the complementary CDFs of prompt and output
lengths on log-log axes (a heavy tail is a straight line), and the index of
dispersion against the window (flat for Poisson, rising for bursty traffic).
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa

from llmlb_bench.workload.stats import index_of_dispersion

W, H, PAD = 640, 400, 60
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")


def _scale(v: np.ndarray, lo: float, hi: float, log: bool, a: float, b: float) -> np.ndarray:
    if log:
        v, lo, hi = np.log10(v), math.log10(lo), math.log10(hi)
    return a + (v - lo) / ((hi - lo) or 1.0) * (b - a)


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [10.0**k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                if lo <= 10.0**k <= hi]
    step = 10 ** math.floor(math.log10((hi - lo) or 1.0))
    while (hi - lo) / step > 8:
        step *= 2
    return list(np.arange(math.ceil(lo / step) * step, hi + step / 2, step))


def _drawable(x: np.ndarray, y: np.ndarray, logx: bool, logy: bool) -> tuple[np.ndarray, np.ndarray]:
    """Drop points a log axis cannot show (and NaNs)."""
    keep = np.isfinite(x) & np.isfinite(y)
    if logx:
        keep &= x > 0
    if logy:
        keep &= y > 0
    return x[keep], y[keep]


def line_plot(series: Sequence[tuple[str, np.ndarray, np.ndarray]], title: str, xlabel: str, ylabel: str,
              logx: bool = False, logy: bool = False) -> str:
    """An SVG line chart of named (x, y) series."""
    pts = [(n, *_drawable(np.asarray(x, float), np.asarray(y, float), logx, logy)) for n, x, y in series]
    pts = [(n, x, y) for n, x, y in pts if len(x)]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
           f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">{escape(xlabel)}</text>',
           f'<text x="15" y="{H / 2}" text-anchor="middle" transform="rotate(-90 15 {H / 2})">{escape(ylabel)}</text>']
    if not pts:
        return "\n".join(out + ["</svg>"])
    xs = np.concatenate([x for _, x, _ in pts])
    ys = np.concatenate([y for _, _, y in pts])
    x0, x1, y0, y1 = xs.min(), xs.max(), (ys.min() if logy else min(0.0, ys.min())), ys.max()
    out.append(f'<rect x="{PAD}" y="{PAD / 2}" width="{W - 1.5 * PAD}" height="{H - 1.5 * PAD}" fill="none" '
               f'stroke="#888"/>')
    for t in _ticks(x0, x1, logx):
        px = _scale(np.array([t]), x0, x1, logx, PAD, W - PAD / 2)[0]
        out.append(f'<text x="{px:.1f}" y="{H - PAD + 18}" text-anchor="middle">{t:g}</text>')
    for t in _ticks(y0, y1, logy):
        py = _scale(np.array([t]), y0, y1, logy, H - PAD, PAD / 2)[0]
        out.append(f'<text x="{PAD - 5}" y="{py + 4:.1f}" text-anchor="end">{t:g}</text>')
    for i, (name, x, y) in enumerate(pts):
        px = _scale(x, x0, x1, logx, PAD, W - PAD / 2)
        py = _scale(y, y0, y1, logy, H - PAD, PAD / 2)
        path = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py))
        colour = COLOURS[i % len(COLOURS)]
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        out.append(f'<text x="{W - PAD}" y="{PAD / 2 + 16 * (i + 1)}" text-anchor="end" fill="{colour}">'
                   f'{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _ccdf(values: np.ndarray, points: int = 400) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(np.asarray(values, dtype=float))
    idx = np.unique(np.linspace(0, len(v) - 1, min(points, len(v))).astype(int))
    return v[idx], 1.0 - idx / len(v)


def write_plots(table: pa.Table, directory: str | Path) -> list[Path]:
    """Write rate.svg, lengths.svg and dispersion.svg under ``directory``; return their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    t = table.column("arrival_s").to_numpy()
    span = float(t.max() - t.min()) or 1.0
    window = 10 ** math.floor(math.log10(max(span / 200, 1e-3)))
    counts = np.bincount(((t - t.min()) // window).astype(np.int64))
    files = {
        "rate.svg": line_plot([("requests/s", np.arange(len(counts)) * window, counts / window)],
                              f"Request rate ({window:g} s windows)", "time (s)", "requests per second"),
        "lengths.svg": line_plot([("input", *_ccdf(table.column("input_tokens").to_numpy())),
                                  ("output", *_ccdf(table.column("output_tokens").to_numpy()))],
                                 "Length tails (CCDF)", "tokens", "P(X > x)", logx=True, logy=True),
    }
    windows = np.array([w for w in (0.01, 0.1, 1, 10, 60, 600, 3600) if span / w >= 10])
    if len(windows):
        idc = np.array([index_of_dispersion(t, w) for w in windows])
        files["dispersion.svg"] = line_plot([("IDC", windows, idc), ("Poisson", windows, np.ones(len(windows)))],
                                            "Index of dispersion of counts", "window (s)", "variance / mean",
                                            logx=True, logy=True)
    paths = []
    for name, svg in files.items():
        path = directory / name
        path.write_text(svg)
        paths.append(path)
    return paths
