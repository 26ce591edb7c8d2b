"""VTC (Sheng et al., OSDI 2024): the Virtual Token Counter scheduler serves the least-served
backlogged tenant first, so a heavy tenant can no longer crowd out a light one as it does
under FCFS; total throughput stays the same."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from llmlb_bench.repro import traces
from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.repro.base import Arm, Column, Reproduction, Verdict, fairness_figure, known, ratio
from llmlb_bench.sim import ClusterConfig

DURATION = {"small": 60.0, "full": 120.0}


def two_tenants(duration: float, seed: int = 0) -> pa.Table:
    """A heavy tenant at 12 req/s and a light one at 6 req/s, both above their fair half of one replica."""
    rng = np.random.default_rng(seed)
    heavy = traces.poisson(rng, 12.0, int(12 * duration * 1.5) + 10)
    light = traces.poisson(rng, 6.0, int(6 * duration * 1.5) + 10)
    heavy, light = heavy[heavy < duration], light[light < duration]
    arrival = np.concatenate([heavy, light])
    tenant = np.array(["heavy"] * len(heavy) + ["light"] * len(light))
    order = np.argsort(arrival, kind="stable")
    n = len(arrival)
    return traces.table(arrival[order], rng.integers(300, 700, n), rng.integers(50, 150, n),
                        tenant=pa.array(tenant[order]).dictionary_encode())


def arms(scale: str) -> list[Arm]:
    t = two_tenants(DURATION[scale])
    return [Arm("fcfs", t, ClusterConfig.build(replicas=1, max_num_seqs=16)),
            Arm("vtc", t, ClusterConfig.build(replicas=1, max_num_seqs=16, scheduler="vtc"))]


def light_norm(s: RunFigures) -> float | None:
    light = (s["per_tenant"] or {}).get("light")
    return None if light is None else light["norm_latency_mean"]


def check(s: dict[str, RunFigures]) -> Verdict:
    f, v = s["fcfs"], s["vtc"]
    gap = ratio(fairness_figure("service_gap_mean")(v), fairness_figure("service_gap_mean")(f))
    jain = (known(fairness_figure("jain_service")(f), "Jain's index"), known(fairness_figure("jain_service")(v), "Jain's index"))
    thr = ratio(v["request_throughput"], f["request_throughput"])
    light = ratio(light_norm(v), light_norm(f))
    ok = gap < 0.5 and jain[1] > jain[0] + 0.03 and abs(thr - 1) < 0.03 and light < 0.6
    return Verdict(ok, f"VTC vs FCFS: mean service gap x{gap:.2f}, Jain's index {jain[0]:.3f} -> {jain[1]:.3f}, "
                       f"throughput x{thr:.3f}, light tenant's latency per output token x{light:.2f} (claim: gap "
                       "below 0.5x, Jain +0.03, throughput within 3%, light tenant below 0.6x)")


REPRO = Reproduction(
    name="vtc-fairness",
    title="VTC: fair service between a heavy and a light tenant vs FCFS",
    source="Sheng et al., Fairness in Serving Large Language Models, OSDI 2024, Figures 3-4 "
           "(service difference between backlogged clients)",
    claim="Under VTC the service (weighted tokens) two backlogged tenants receive stays close, where FCFS "
          "gives the heavy tenant service in proportion to its demand; throughput is unchanged.",
    setup="One A100-80G replica of Llama-3-8B with 16 batch seats (about 9.2 requests/s). A heavy tenant "
          "offers 12 req/s and a light one 6 req/s (Poisson; prompts 300-700, outputs 50-150 tokens), both "
          "above their fair half. Engine scheduler FCFS vs VTC (input weight 1, output weight 2); fairness "
          "measured in 10 s windows where both tenants are backlogged (docs/metrics.md).",
    arms=arms,
    columns=(Column("gap", "mean service gap (tokens)", fairness_figure("service_gap_mean"), "{:,.0f}"),
             Column("jain", "Jain's index (service)", fairness_figure("jain_service"), "{:.3f}"),
             Column("light", "light tenant E2E per output token (s)", light_norm),
             Column("throughput", "throughput (req/s)", lambda s: s["request_throughput"])),
    check=check,
    figure="gap",
)
