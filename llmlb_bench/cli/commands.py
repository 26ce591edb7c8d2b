"""Every ``llmlb`` command: its name, the module that defines it, and the one-line summary
``llmlb --help`` lists.

Commands load lazily (:class:`~llmlb_bench.cli.lazy.LazyGroup`): ``llmlb --help`` reads this table
and imports no command module, and ``llmlb CMD ...`` imports only ``CMD``'s module, so no command
pays for another's dependencies (DuckDB, pandas, the simulator, the replayer ...). A new command is
one module under ``llmlb_bench/cli/`` plus one line here; ``tests/test_cli_startup.py`` checks that
every command module is listed and that each summary is the command's own first help paragraph.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple


class Entry(NamedTuple):
    #: module under llmlb_bench.cli that registers the command (or group) on the app when imported
    module: str
    #: the first paragraph of the command's help, as ``llmlb --help`` lists it
    summary: str


COMMANDS: dict[str, Entry] = {
    "policies": Entry("policies", "List routing policies by family, and engine-level schedulers, with a one-line "
                                  "description and their parameters."),
    "query": Entry("query", "Run read-only SQL (DuckDB) over all runs under --results."),
    "report": Entry("report", "Summarise and compare runs: latency percentiles with bootstrap intervals, SLO "
                              "attainment and goodput, token pacing, fairness, energy and cost, load curves."),
    "run": Entry("run", "Generate a trace from SPEC, simulate it under each policy, store the runs and print a "
                        "comparison."),
    "simulate": Entry("simulate", "Simulate TRACE on a cluster (identical replicas, or pools from --cluster) and "
                                  "store the run under --results."),
    "gen": Entry("gen", "Generate a trace from SPEC and write it atomically to --output."),
    "replay": Entry("replay", "Replay TRACE against real endpoints, open loop, and store the run under --results."),
    "sweep": Entry("sweep", "Run a SWEEP over rate x policy x cluster x workload x seed on the simulator; print "
                            "capacities, stability curves and knees. Reruns skip finished cells, so an interrupted "
                            "sweep resumes."),
    "import-results": Entry("import_results", "Import results of other benchmarking tools as runs (backend = the "
                                              "tool), to report them beside ours."),
    "gate": Entry("gate", "Compare CANDIDATE with BASELINE under the rules; exit 0 pass, 1 regression, 2 usage error."),
    "serve": Entry("serve", "Serve a simulated fleet over OpenAI-compatible HTTP, streaming tokens at the simulated "
                            "times."),
    "capacity": Entry("capacity", "Find the highest request rate the ENDPOINTs serve with at least --attainment of "
                                  "requests within --slo, by geometric bisection over --rate, each probe a real "
                                  "open-loop replay."),
    "calibrate": Entry("calibrate", "Fit the simulator's step-time model to ENDPOINT: prefill probes of growing "
                                    "prompt length, concurrent decodes at growing batch and context, and repeated "
                                    "prefixes; print the fit and its residuals and write the profile."),
    "route": Entry("route", "Route OpenAI-compatible requests to BACKENDs with an llmlb policy and record each as a "
                            "results row."),
    "trace": Entry("trace", "Import real traces, characterise traces, fit workload specs to them."),
    "repro": Entry("repro", "Scripted paper reproductions: each runs simulations, checks the paper's claim and "
                            "writes reports/<name>/README.md with its figure (docs/repro.md)."),
    "routers": Entry("routers", "Real routers under test (vllm-router, sglang-router, smg): install them, run the "
                                "router scenario suite side by side (docs/routers.md)."),
    "engine": Entry("engine", "Start local real engines on 127.0.0.1 (no GPU needed): vLLM's CPU build or "
                              "llama-server, with a tiny random-weight model written locally. See docs/engines.md."),
    "learn": Entry("learn", "Train routing policies and output-length predictors in the simulator, and run the "
                            "learning benchmark's standard tasks (docs/learning.md)."),
    "validate": Entry("validate", "Is the simulator right about THIS engine? Calibrate it (or take --profile), "
                                  "replay the trace --repeats times and simulate it under --sim-seeds seeds, then print "
                                  "per figure the bias (median simulated / median real - 1, with a bootstrap "
                                  "interval), both sides' spread over the repeats, the per-request E2E MAPE, the "
                                  "engine's decode steps by batch on both sides (a diagnosis: where the latencies "
                                  "miss, does the step model?), and a "
                                  "one-line verdict against the aims (|bias| <= 5% E2E/TPOT p50/p90, <= 10% TTFT, "
                                  "spread within 0.5-2x). Every replay and simulation is stored as an ordinary run "
                                  "(compare any two with llmlb report); see docs/fidelity.md."),
}


def load(name: str) -> None:
    """Import the module of command ``name`` (which registers it on the app)."""
    importlib.import_module(f"llmlb_bench.cli.{COMMANDS[name].module}")


def load_all() -> None:
    """Register every command on the app at once (for walking the whole CLI, e.g. in tests)."""
    for name in COMMANDS:
        load(name)
