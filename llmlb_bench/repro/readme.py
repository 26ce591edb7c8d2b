"""A reproduction's report: README.md (claim, setup, results table, verdict) and its figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmlb_bench.repro.base import Arm, Reproduction, Verdict
from llmlb_bench.report.figures import _plt


def table(repro: Reproduction, arms: list[Arm], summaries: dict[str, dict[str, Any]]) -> str:
    """The results as a Markdown table, one row per arm, in the order the arms ran."""
    head = ["run", "policy"] + [c.header for c in repro.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in arms:
        s = summaries[arm.label]
        lines.append("| " + " | ".join([arm.label, arm.policy] + [c.text(s) for c in repro.columns]) + " |")
    return "\n".join(lines)


def readme(repro: Reproduction, arms: list[Arm], summaries: dict[str, dict[str, Any]], verdict: Verdict,
           scale: str, seed: int, figures: list[str]) -> str:
    verdict_word = "PASS" if verdict.passed else "FAIL"
    parts = [
        f"# {repro.title}",
        "",
        f"**Source:** {repro.source}",
        "",
        f"**Claim:** {repro.claim}",
        "",
        f"**Verdict: {verdict_word}** — {verdict.evidence}",
        "",
        "## Setup",
        "",
        repro.setup,
        "",
        f"SLO: `{repro.slo}`" if repro.slo else "No SLO (the claim is about latency or fairness directly).",
        "",
        f"Scale `{scale}`, seed {seed}. Regenerate with `llmlb repro run {repro.name} --scale {scale} --seed {seed}`"
        " (simulator; the same seed gives the same report).",
        "",
        "## Results",
        "",
        table(repro, arms, summaries),
        "",
    ]
    parts += [f"![{repro.column(repro.figure).header}]({name})" for name in figures]
    return "\n".join(parts).rstrip() + "\n"


def figure(repro: Reproduction, arms: list[Arm], summaries: dict[str, dict[str, Any]], out: Path) -> list[Path]:
    """The claim's figure: lines against ``x`` per series for a sweep, bars per arm otherwise."""
    plt = _plt()
    col = repro.column(repro.figure)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if all(a.x is not None for a in arms):
        series: dict[str, list[tuple[float, float]]] = {}
        for a in arms:
            v = col.get(summaries[a.label])
            series.setdefault(a.series or a.policy, []).append((a.x, float("nan") if v is None else v))  # type: ignore[arg-type]
        for name, pts in series.items():
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_xlabel(repro.x_label)
        ax.legend()
    else:
        vals = [col.get(summaries[a.label]) for a in arms]
        ax.bar([a.label for a in arms], [float("nan") if v is None else v for v in vals])
        ax.tick_params(axis="x", labelrotation=20)
    ax.set_ylabel(col.header)
    ax.set_title(repro.title, fontsize=9)
    meta = {"png": {"Software": None}, "svg": {"Date": None}}
    files = []
    for fmt in ("svg", "png"):
        path = out / f"{repro.figure.replace('.', '_')}.{fmt}"
        tmp = path.with_name(f".{path.name}.tmp")
        fig.savefig(tmp, format=fmt, metadata=meta[fmt], bbox_inches="tight", dpi=120)
        tmp.replace(path)
        files.append(path)
    plt.close(fig)
    return files
