"""Every example cluster in clusters/ runs: each is simulated on a small trace of the workload its
header suggests, and the feature it exists to show must leave its mark on the run (a preset that
stopped exercising its feature, e.g. a KV budget so large that nothing is swapped, fails here)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import cli
from llmlb_bench.report.shape import ReportDoc
from llmlb_bench.run_summary import RunSummary
from shape_check import mismatches
from llmlb_bench.schema import write_trace
from llmlb_bench.workload import generate, load_spec

REPO = Path(__file__).resolve().parents[1]
CLUSTERS = sorted((REPO / "clusters").glob("*.toml"))


class Run:
    def __init__(self, folder: Path) -> None:
        meta = json.loads((folder / "run.json").read_text())
        self.summary: dict[str, Any] = meta["summary"]
        self.report: dict[str, Any] = {}           # the JSON report simulate printed
        self.cluster: dict[str, Any] = meta["config"]["cluster"]
        self.requests = pq.read_table(folder / "requests.parquet").to_pylist()
        self.series: pa.Table = pq.read_table(folder / "series.parquet")


Rerun = Callable[[list[str]], Run]


def _tpot(r: dict[str, Any]) -> float:
    return (r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)


def _straggler(run: Run, rerun: Rerun) -> bool:
    """r1 is 3x slower from 10 s to 130 s: requests it decodes inside that window have a TPOT
    well above the other replicas' in the same window."""
    inside = [r for r in run.requests if r["status"] == "ok" and r["output_tokens"] > 1
              and 10 <= r["first_token_s"] and r["last_token_s"] <= 130]
    slow = [_tpot(r) for r in inside if r["target"] == "r1"]
    rest = [_tpot(r) for r in inside if r["target"] != "r1"]
    assert len(slow) >= 5 and len(rest) >= 5
    return statistics.median(slow) > 2 * statistics.median(rest)


def _vtc_changes_the_order(run: Run, rerun: Rerun) -> bool:
    """The same trace under FCFS engines starts a good share of the requests at other times."""
    fcfs = rerun(["--scheduler", "fcfs"])
    assert run.cluster["scheduler"] == "vtc" and fcfs.cluster["scheduler"] == "fcfs"
    first = {r["request_id"]: r["first_token_s"] for r in fcfs.requests}
    return sum(r["first_token_s"] != first[r["request_id"]] for r in run.requests) > len(run.requests) // 10


#: preset -> (workload, requests, policy, what its run must show)
CASES: dict[str, tuple[str, int, str, Callable[[Run, Rerun], bool]]] = {
    "a100x4": ("chat", 200, "least_outstanding", lambda run, rerun: run.summary["replicas"]["initial"] == 4),
    "autoscale": ("chat", 600, "least_outstanding", lambda run, rerun: run.summary["replicas"]["added"] > 0),
    "autoscale-pid": ("chat", 600, "least_outstanding",
                      lambda run, rerun: run.summary["replicas"]["added"] + run.summary["replicas"]["retired"] > 0),
    "disaggregated": ("chat", 200, "pd_pair",
                      lambda run, rerun: all(r["prefill_target"] != r["decode_target"]
                                             for r in run.requests if r["status"] == "ok")),
    "failures": ("chat", 600, "least_outstanding", lambda run, rerun: run.summary["failures"] > 0),
    "green-clock": ("chat", 400, "least_outstanding", lambda run, rerun: "green" in run.summary),
    "hetero": ("chat", 300, "capacity_weighted",
               lambda run, rerun: len({r["target"] for r in run.requests}) == 5),
    "moe-mixtral": ("chat", 200, "least_outstanding", lambda run, rerun: bool(run.summary.get("expert_load"))),
    "multi-lora": ("multi-lora", 300, "lora_affinity",
                   lambda run, rerun: sum(run.series.column("adapter_loads").to_pylist()) > 0),
    "speculative": ("chat", 200, "round_robin",
                    lambda run, rerun: sum(r["spec_accepted_tokens"] or 0 for r in run.requests) > 0),
    "kv-swap": ("reasoning", 200, "least_outstanding",
                lambda run, rerun: run.summary["swap"]["swap_outs"] > 0),
    "pipeline": ("chat", 100, "least_outstanding",
                 lambda run, rerun: run.cluster["pp"] == 2 and run.summary["gpu_hours"]
                 == pytest.approx(8 * run.summary["sim_time_s"] / 3600, rel=1e-6)),
    "fair-tenants": ("multi-tenant", 300, "least_outstanding", _vtc_changes_the_order),
    "stragglers": ("chat", 600, "round_robin", _straggler),
}


def test_every_preset_has_a_case() -> None:
    assert {p.stem for p in CLUSTERS} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_preset_runs_and_shows_its_feature(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload, n, policy, check = CASES[name]
    trace = tmp_path / "t.parquet"
    write_trace(generate(load_spec(REPO / "workloads" / f"{workload}.toml").replace(requests=n)), trace)

    def simulate(extra: list[str]) -> Run:
        run_id = f"r{len(list(tmp_path.glob('r*')))}"
        code, out, err = cli(["simulate", str(trace), "--cluster", str(REPO / "clusters" / f"{name}.toml"), "-p", policy,
                            "--results", str(tmp_path), "--run-id", run_id, "-f", "json", *extra], capsys)
        assert code == 0, err
        run = Run(tmp_path / run_id)
        run.report = json.loads(out)
        return run

    run = simulate([])
    assert len(run.requests) == n and run.summary["requests"] == n
    assert check(run, simulate), f"{name}: its run does not show the feature it exists for"
    # what the simulator wrote and the report printed have the shapes their types declare
    assert mismatches(run.summary, RunSummary, "summary") == []
    assert mismatches(run.report, ReportDoc, "report") == []
