"""Run a reproduction: simulate its arms in a scratch folder, summarise them with the ordinary
metrics, check the claim and write ``reports/<name>/`` (README.md and the figure).

The stored runs are scratch: the report carries everything a reader needs, and the same
seed regenerates the same report byte for byte (no timestamps, fixed figure metadata).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from llmlb_bench.errors import UserError
from llmlb_bench.experiment import simulate_run
from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.repro.base import Arm, Reproduction, SCALES, Verdict, VerdictRecord
from llmlb_bench.repro.readme import figure, index, readme
from llmlb_bench.repro.registry import REPRODUCTIONS
from llmlb_bench.schema import write_trace
from llmlb_bench.sim.profile import ProfileDoc
from llmlb_bench.store.run import write_text_atomic
from llmlb_bench.store.views import Catalog


@dataclass(frozen=True)
class Outcome:
    """What ``run`` produced: the verdict, each arm's summary and the files written."""

    repro: Reproduction
    verdict: Verdict
    summaries: dict[str, RunFigures]
    files: tuple[Path, ...]


def evaluate(repro: Reproduction, scale: str, seed: int = 0,
             profile: ProfileDoc | None = None) -> tuple[Verdict, dict[str, RunFigures]]:
    """Simulate every arm and check the claim; nothing is kept on disk."""
    summaries = _simulate(repro, _arms(repro, scale, profile), seed)
    return repro.check(summaries), summaries


def _arms(repro: Reproduction, scale: str, profile: ProfileDoc | None = None) -> list[Arm]:
    """The reproduction's arms; with a measured ``profile`` every arm's cluster runs on it
    (the arms' own engine settings, e.g. Sarathi's chunk sizes, still apply)."""
    if scale not in SCALES:
        raise UserError(f"unknown scale {scale!r} (scales: {', '.join(SCALES)})", "--scale")
    arms = repro.arms(scale)
    return arms if profile is None else [replace(a, cluster=a.cluster.with_profile(profile)) for a in arms]


def _simulate(repro: Reproduction, arms: list[Arm], seed: int) -> dict[str, RunFigures]:
    """Each arm's summary by label, from runs stored in a scratch folder."""
    with tempfile.TemporaryDirectory(prefix=f"llmlb-repro-{repro.name}-") as tmp:
        work = Path(tmp)
        for i, arm in enumerate(arms):
            trace_path = work / "traces" / f"{i}.parquet"
            trace_path.parent.mkdir(exist_ok=True)
            write_trace(arm.trace, trace_path)
            simulate_run(arm.trace, trace_path, arm.cluster, arm.policy, arm.args, seed, work / "runs",
                         label=arm.label, run_id=f"{i:02d}")
        rows = summarize(Catalog([work / "runs"]), Slo.parse(repro.slo, f"repro {repro.name}"),
                         Options(ci=False, window_s=repro.window_s))
    by_id = {r["run_id"]: r for r in rows}
    return {arm.label: by_id[f"{i:02d}"] for i, arm in enumerate(arms)}


def run(repro: Reproduction, scale: str, reports: Path, seed: int = 0,
        profile: ProfileDoc | None = None) -> Outcome:
    """Evaluate ``repro`` and write ``reports/<name>/`` (README.md, verdict.json, the figure as SVG
    and PNG), then rewrite the gallery ``reports/README.md`` from every report's verdict.json.
    With a measured ``profile`` (sim/profile.py), verdict.json names the engine it came from."""
    arms = _arms(repro, scale, profile)
    summaries = _simulate(repro, arms, seed)
    verdict = repro.check(summaries)
    out = reports / repro.name
    out.mkdir(parents=True, exist_ok=True)
    files = figure(repro, arms, summaries, out)
    text = readme(repro, arms, summaries, verdict, scale, seed, [f.name for f in files if f.suffix == ".svg"])
    path = out / "README.md"
    write_text_atomic(path, text)
    record: VerdictRecord = {"name": repro.name, "passed": verdict.passed, "evidence": verdict.evidence, "scale": scale,
                             "seed": seed}
    if profile is not None:
        record["profile"] = profile.get("source", {})
    write_text_atomic(out / "verdict.json", json.dumps(record, indent=2) + "\n")
    write_text_atomic(reports / "README.md", index(_verdicts(reports)))
    return Outcome(repro, verdict, summaries, (path, out / "verdict.json", *files))


def _verdicts(reports: Path) -> list[tuple[Reproduction, VerdictRecord]]:
    """The latest verdict of every registered reproduction that has a report, in registry order."""
    found = []
    for r in REPRODUCTIONS.values():
        path = reports / r.name / "verdict.json"
        if path.exists():
            record: VerdictRecord = json.loads(path.read_text(encoding="utf-8"))   # as run wrote it
            found.append((r, record))
    return found
