"""Results of other benchmarking tools, imported into the store as ordinary runs.

``import_results(path, results)`` reads vLLM ``bench serve`` detailed JSON,
GuideLLM ``benchmarks.json`` or AIPerf ``profile_export.jsonl`` and writes
one run per benchmark in the file, with ``backend`` = the tool's name, so a
single ``llmlb report`` compares them with simulated and replayed runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from llmlb_bench.errors import UserError
from llmlb_bench.peer_results import aiperf, guidellm, vllm
from llmlb_bench.peer_results.common import ImportedRun, run_id_for, store
from llmlb_bench.tomlfile import unknown_choice

PARSERS: dict[str, Callable[[Path], list[ImportedRun]]] = {
    "vllm": vllm.parse, "guidellm": guidellm.parse, "aiperf": aiperf.parse}


def detect(path: Path) -> str:
    """Which tool wrote ``path``, from its structure (not its name)."""
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            doc = json.loads(first)
        except json.JSONDecodeError:
            raise UserError("neither JSON nor JSON lines; expected a vLLM, GuideLLM or AIPerf result file", path) from None
    if isinstance(doc, dict):
        if "ttfts" in doc or "itls" in doc:
            return "vllm"
        if "benchmarks" in doc:
            return "guidellm"
        if "metadata" in doc and ("metrics" in doc or "error" in doc):
            return "aiperf"
    raise UserError("not a known result file (vLLM bench serve --save-detailed JSON, GuideLLM benchmarks.json, "
                    "AIPerf profile_export.jsonl); name the tool with --tool", path)


def import_results(path: Path, results: Path, tool: str = "auto", label: str | None = None) -> list[Path]:
    """Parse ``path`` and store its runs under ``results``; returns the run folders written."""
    if not path.is_file():
        raise UserError("no such file", path)
    tool = detect(path) if tool == "auto" else tool
    if tool not in PARSERS:
        raise unknown_choice("tool", tool, PARSERS, "--tool")
    runs = PARSERS[tool](path)
    for r in runs:   # refuse before writing anything
        run_id = run_id_for(r, tool, path)
        if (results / run_id).exists():
            raise UserError(f"run {run_id} already exists (imported before?)", results / run_id)
    return [store(r, tool, path, results, f"{label}-{r.name}" if label and r.name else label) for r in runs]
