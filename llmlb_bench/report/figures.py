"""Report figures with matplotlib (the optional ``plots`` extra): for the HTML report and for papers.

Figures are drawn from the report document and :mod:`llmlb_bench.report.figdata`
only. Each has a file name; :func:`save` writes it as PNG, SVG and PDF with
fixed metadata and SVG ids, so the same runs give byte-identical files.

* ``compare``: per run, TTFT and E2E p99 with their bootstrap intervals,
  SLO attainment and energy per good token (the policy comparison at a glance);
* ``latency_cdf``: TTFT, TPOT and E2E CDFs, one line per run;
* ``tenants``: per-tenant attainment and normalized latency (runs with several tenants);
* ``load_<curve>``: latency (p50 and p99 with their intervals as bands) and
  throughput/goodput against offered rate, the knee marked;
* ``timeline_<run>``: waiting queue, KV use and power per replica over time.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, TypeAlias

from llmlb_bench.errors import UserError
from llmlb_bench.report.figdata import CDF_FIGURES, FigureData, Lines
from llmlb_bench.metrics.run_figures import LatencyName, LoadCurve, PercentileKey, RunFigures
from llmlb_bench.report.shape import ReportDoc
from llmlb_bench.report.tables import run_name

FORMATS = ("png", "svg", "pdf")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
#: matplotlib's pyplot and what it draws: the optional ``plots`` extra, imported when a figure is drawn
#: (:func:`_plt`), so mypy may not have its types here: a third-party boundary, ``Any``
Plot: TypeAlias = Any
#: one bar of a panel: value, and the error below and above it
Bar = tuple[float, float, float]


def _plt() -> Plot:
    """pyplot on the non-interactive backend, or a one-line error when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("figure files need matplotlib: pip install 'llmlb-bench[plots]'", "--figures") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "llmlb", "svg.fonttype": "path", "font.size": 9,
                         "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": 100})
    return plt


def available() -> bool:
    """Whether matplotlib can be imported (without importing it twice)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    """Fail early, before any work, when matplotlib is missing."""
    _plt()


def _colors(n: int) -> list[Plot]:
    plt = _plt()
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _err(s: RunFigures, fig: LatencyName, p: PercentileKey, scale: float) -> Bar:
    d = s[fig]
    v = d.get(p)
    ci = (d.get("ci") or {}).get(p)
    if v is None:
        return float("nan"), 0.0, 0.0
    lo, hi = ci if ci else (v, v)
    return v * scale, (v - lo) * scale, (hi - v) * scale


def _attainment(s: RunFigures) -> Bar:
    a = slo["attainment"] if (slo := s["slo"]) else None
    return (100 * a if a is not None else float("nan")), 0.0, 0.0


def _energy(key: Literal["j_per_good_token", "j_per_output_token"]) -> Callable[[RunFigures], Bar]:
    return lambda s: ((e[key] if (e := s["energy"]) else None) or float("nan"), 0.0, 0.0)


def compare(doc: ReportDoc) -> Plot:
    plt = _plt()
    runs = doc["runs"]
    names = [run_name(s) for s in runs]
    colors = _colors(len(runs))
    with_slo = any(s.get("slo") for s in runs)
    energy_key: Literal["j_per_good_token", "j_per_output_token"] = \
        "j_per_good_token" if with_slo else "j_per_output_token"
    panels: list[tuple[str, Callable[[RunFigures], Bar]]] = [
        ("TTFT p99 (ms)", lambda s: _err(s, "ttft", "p99", 1e3)),
              ("E2E p99 (s)", lambda s: _err(s, "e2e", "p99", 1.0))]
    if with_slo:
        panels.append(("SLO attainment (%)", _attainment))
    if any((e := s.get("energy")) is not None and e.get(energy_key) for s in runs):
        panels.append(("J per good token" if with_slo else "J per output token", _energy(energy_key)))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 0.35 * len(runs) + 1.6), squeeze=False)
    y = list(range(len(runs)))
    for i, (ax, (title, get)) in enumerate(zip(axes[0], panels)):
        vals = [get(s) for s in runs]
        ax.barh(y, [v[0] for v in vals], xerr=[[v[1] for v in vals], [v[2] for v in vals]], color=colors, capsize=3)
        ax.set_yticks(y, names if i == 0 else [""] * len(runs))
        ax.invert_yaxis()
        ax.set_title(title)
    fig.tight_layout()
    return fig


def latency_cdf(doc: ReportDoc, data: FigureData) -> Plot:
    plt = _plt()
    runs = doc["runs"]
    colors = _colors(len(runs))
    fig, axes = plt.subplots(1, len(CDF_FIGURES), figsize=(4 * len(CDF_FIGURES), 3.2), squeeze=False)
    for ax, (label, _col, _scale, unit) in zip(axes[0], CDF_FIGURES):
        for s, c in zip(runs, colors):
            cdf = data["cdfs"].get(label, {}).get(s["run_id"])
            if cdf:
                ax.plot(cdf["x"], cdf["p"], color=c, label=run_name(s), linewidth=1.4)
        ax.set_xlabel(f"{label} ({unit})")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.005)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def tenants(doc: ReportDoc) -> Plot | None:
    runs = [s for s in doc["runs"] if s.get("fairness")]
    if not runs:
        return None
    plt = _plt()
    names = sorted({t for s in runs for t in s["per_tenant"] or {}})
    colors = _colors(len(runs))
    panels: list[tuple[str, Callable[[RunFigures, str], float]]] = [("mean normalized latency (ms/token)",
               lambda s, t: 1e3 * (_tenant_latency(s, t) or float("nan")))]
    if any(s.get("slo") for s in runs):
        panels.insert(0, ("SLO attainment (%)", lambda s, t: 100 * (_tenant_attainment(s, t) or 0.0)))
    fig, axes = plt.subplots(1, len(panels), figsize=(max(4.0, 0.9 * len(names) * len(runs) / 2 + 2) * len(panels), 3.2),
                             squeeze=False)
    width = 0.8 / len(runs)
    for ax, (title, get) in zip(axes[0], panels):
        for i, (s, c) in enumerate(zip(runs, colors)):
            ax.bar([k + i * width for k in range(len(names))], [get(s, t) for t in names], width, color=c,
                   label=run_name(s))
        ax.set_xticks([k + width * (len(runs) - 1) / 2 for k in range(len(names))], names)
        ax.set_title(title)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _tenant_latency(s: RunFigures, tenant: str) -> float | None:
    """A tenant's mean normalized latency in a run (None where the run has no such tenant)."""
    d = f["per_tenant"].get(tenant) if (f := s["fairness"]) else None
    return d["norm_latency_mean"] if d else None


def _tenant_attainment(s: RunFigures, tenant: str) -> float | None:
    d = by.get(tenant) if (by := s["per_tenant"]) else None
    return d["attainment"] if d else None


def load_curve(curve: LoadCurve) -> Plot:
    plt = _plt()
    pts = curve["points"]
    x = [p["rate"] for p in pts]
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(9, 3.2))
    for stat, color in (("p50", "tab:blue"), ("p99", "tab:red")):
        y = [p["e2e"].get(stat) for p in pts]
        ci = [(p["e2e"].get("ci") or {}).get(stat) or (v, v) for p, v in zip(pts, y)]
        lat.plot(x, y, marker="o", color=color, label=f"E2E {stat}")
        lat.fill_between(x, [c[0] for c in ci], [c[1] for c in ci], color=color, alpha=0.2, linewidth=0)
    lat.set_xlabel("offered rate (req/s)")
    lat.set_ylabel("E2E latency (s)")
    thr.plot(x, [p["throughput"] for p in pts], marker="o", label="throughput")
    if any(p["goodput"] is not None for p in pts):
        thr.plot(x, [p["goodput"] for p in pts], marker="s", label="goodput")
    thr.plot(x, x, color="grey", linestyle=":", label="offered")
    thr.set_xlabel("offered rate (req/s)")
    thr.set_ylabel("requests/s")
    if curve["knee_rate"] is not None:
        for ax in (lat, thr):
            ax.axvline(curve["knee_rate"], color="black", linestyle="--", linewidth=1)
        lat.annotate(f"knee {curve['knee_rate']:.3g}", (curve["knee_rate"], lat.get_ylim()[1]),
                     ha="right", va="top", fontsize=8, rotation=90)
    lat.legend(fontsize=7)
    thr.legend(fontsize=7)
    fig.suptitle(curve["name"], fontsize=9)
    fig.tight_layout()
    return fig


def timeline(name: str, targets: Lines) -> Plot:
    plt = _plt()
    panels = [(k, label) for k, label in (("waiting", "waiting requests"), ("kv_util", "KV blocks used (share)"),
                                          ("power_w", "power (W)"))
              if any(v is not None for t in targets.values() for v in t[k])]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.9 * len(panels) + 0.6), sharex=True, squeeze=False)
    colors = _colors(len(targets))
    for ax, (key, label) in zip(axes[:, 0], panels):
        for (target, t), c in zip(sorted(targets.items()), colors):
            ax.plot(t["t_s"], [float("nan") if v is None else v for v in t[key]], color=c, linewidth=1,
                    label=target)
        ax.set_ylabel(label)
    axes[-1, 0].set_xlabel("time (s)")
    if len(targets) <= 16:
        axes[0, 0].legend(fontsize=7, ncol=min(len(targets), 8), loc="upper right")
    fig.suptitle(name, fontsize=9)
    fig.tight_layout()
    return fig


def all_figures(doc: ReportDoc, data: FigureData) -> Iterator[tuple[str, str, Plot]]:
    """``(file stem, caption, figure)`` for every figure the runs support."""
    yield "compare", "Policy comparison: p99 latency with 95% bootstrap intervals, attainment, energy", compare(doc)
    yield "latency_cdf", "Latency CDFs (ok requests)", latency_cdf(doc, data)
    fig = tenants(doc)
    if fig is not None:
        yield "tenants", "Per-tenant attainment and normalized latency", fig
    for curve in doc["curves"]:
        yield (f"load_{_SAFE.sub('_', curve['name'])}",
               f"{curve['name']}: latency and throughput against offered load (bands: 95% bootstrap intervals)",
               load_curve(curve))
    for s in doc["runs"]:
        targets = data["timelines"].get(s["run_id"])
        if targets:
            yield (f"timeline_{_SAFE.sub('_', s['run_id'])}", f"{run_name(s)}: queue, KV use and power per replica",
                   timeline(run_name(s), targets))


def _svg(fig: Plot) -> str:
    """The figure as inline SVG markup: no XML prolog, no metadata block, no external references."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buf.getvalue()
    return _METADATA.sub("", text[text.index("<svg"):])


def render(doc: ReportDoc, data: FigureData, directory: Path | None = None,
           formats: tuple[str, ...] = FORMATS) -> list[tuple[str, str, str]]:
    """Draw every figure once: ``(stem, caption, inline SVG)`` each, and files under ``directory`` if given.

    Files are written as ``<stem>.<format>`` (temp name, then rename) with
    fixed metadata, so the same runs give the same bytes.
    """
    plt = _plt()
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    meta = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None, "ModDate": None}}
    out = []
    for stem, caption, fig in all_figures(doc, data):
        out.append((stem, caption, _svg(fig)))
        for fmt in formats if directory is not None else ():
            assert directory is not None
            path = directory / f"{stem}.{fmt}"
            tmp = path.with_name(f".{path.name}.tmp")
            fig.savefig(tmp, format=fmt, metadata=meta[fmt], bbox_inches="tight", dpi=150)
            tmp.replace(path)
        plt.close(fig)
    return out
