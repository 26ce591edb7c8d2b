"""DynamoLLM-style energy (Stojkovic et al., HPCA 2025): a fleet provisioned for the peak of a
diurnal load idles through the trough; scaling the replica count with the load cuts the energy
per good token while the SLO still holds (DynamoLLM also scales GPU frequency and parallelism;
the simulator scales replicas only, the largest of its knobs)."""

from __future__ import annotations

from llmlb_bench.repro import traces
from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.repro.base import Arm, Column, Reproduction, Verdict, energy_figure, known, pct, ratio, slo_figure
from llmlb_bench.sim import ClusterConfig

# workloads/diurnal.toml: 8 req/s mean, +-50% over a 600 s period; scaled to fill the peak fleet
RATE_SCALE = {"small": 1.0, "full": 3.0}
PEAK_REPLICAS = {"small": 2, "full": 4}


def autoscale(max_replicas: int) -> dict[str, object]:
    return {"policy": "concurrency", "interval_s": 10.0, "cold_start_s": 30.0,
            "args": {"target": 64.0, "min_replicas": 1, "max_replicas": max_replicas, "window_s": 30.0}}


def arms(scale: str) -> list[Arm]:
    t = traces.preset("diurnal", seed=1, rate_scale=RATE_SCALE[scale])
    n = PEAK_REPLICAS[scale]
    return [Arm(f"fixed {n} replicas", t, ClusterConfig.build(replicas=n), "least_outstanding"),
            Arm(f"autoscaled 1-{n}", t, ClusterConfig.build(replicas=n, autoscale=autoscale(n)), "least_outstanding")]


def check(s: dict[str, RunFigures]) -> Verdict:
    fixed, scaled = (s[k] for k in s)
    j_fixed, j_scaled = (known(energy_figure("j_per_good_token")(r), "J per good token") for r in (fixed, scaled))
    j = ratio(j_scaled, j_fixed)
    att = (known(slo_figure("attainment")(fixed), "attainment"), known(slo_figure("attainment")(scaled), "attainment"))
    ok = j < 0.9 and att[1] >= att[0] - 0.05
    return Verdict(ok, f"autoscaled vs fixed: energy per good token x{j:.2f} "
                       f"({j_fixed:.3f} -> {j_scaled:.3f} J), "
                       f"attainment {att[0]:.1%} -> {att[1]:.1%} (claim: at least 10% less energy per good token, "
                       "attainment within 5 points)")


REPRO = Reproduction(
    name="dynamollm-energy",
    title="DynamoLLM-style energy: J per good token under diurnal load, with and without scaling",
    source="Stojkovic et al., DynamoLLM, HPCA 2025, Figure 12 (energy under production diurnal load)",
    claim="Scaling the serving fleet with a diurnal load lowers the energy per good token, because idle replicas "
          "still draw power, while the SLO attainment stays about the same.",
    setup="Preset `workloads/diurnal.toml` (Poisson chat with a ±50% diurnal modulation over a 600 s period) at "
          "3x its 8 req/s mean. A100-80G replicas of Llama-3-8B: a fixed fleet of 4 (provisioned for the peak) vs "
          "a concurrency autoscaler (target 64 in-flight per replica, 1-4 replicas, 10 s interval, 30 s cold start "
          "drawing idle power). Energy from the GPU catalog's idle and peak power, integrated over each replica's life.",
    arms=arms,
    columns=(Column("j_per_good", "J per good token", energy_figure("j_per_good_token"), "{:.3f}"),
             Column("energy_kj", "energy (kJ)", lambda s: (energy_figure("energy_j")(s) or 0) / 1e3, "{:,.0f}"),
             Column("attainment", "attainment", slo_figure("attainment"), "{:.1%}"),
             Column("ttft.p99", "TTFT p99 (s)", pct("ttft", "p99"))),
    check=check,
    figure="j_per_good",
    slo="ttft=2s,tpot=100ms",
)
