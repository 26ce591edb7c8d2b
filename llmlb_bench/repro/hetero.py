"""Splitwise (Patel et al., ISCA 2024): prompt phases are compute-bound and token phases
memory-bound, so running prefill on H100s and decode on cheaper, lower-power A100s meets the
same SLO at lower cost and power than a homogeneous fleet (Splitwise-HA)."""

from __future__ import annotations

from llmlb_bench.repro import traces
from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.repro.base import Arm, Column, Reproduction, Verdict, energy_figure, known, pct, slo_figure
from llmlb_bench.sim import ClusterConfig

RATE = 40.0
DURATION_S = {"small": 20.0, "full": 60.0}
ATTAINMENT = 0.9


def _pd(prefill: tuple[str, int], decode: tuple[str, int]) -> ClusterConfig:
    return ClusterConfig.build(pools=({"name": "prefill", "gpu": prefill[0], "replicas": prefill[1]},
                                {"name": "decode", "gpu": decode[0], "replicas": decode[1]}))


# label -> (cluster, policy)
FLEETS: dict[str, tuple[ClusterConfig, str]] = {
    "2x H100": (ClusterConfig.build(replicas=2, gpu="h100-sxm"), "least_outstanding"),
    "3x H100": (ClusterConfig.build(replicas=3, gpu="h100-sxm"), "least_outstanding"),
    "3x A100": (ClusterConfig.build(replicas=3), "least_outstanding"),
    "4x A100": (ClusterConfig.build(replicas=4), "least_outstanding"),
    "H100 + 2x A100 mixed": (ClusterConfig.build(pools=({"name": "h100", "gpu": "h100-sxm", "replicas": 1},
                                                  {"name": "a100", "gpu": "a100-80g", "replicas": 2})),
                             "capacity_weighted"),
    "H100 prefill + 2x H100 decode": (_pd(("h100-sxm", 1), ("h100-sxm", 2)), "pd_pair"),
    "H100 prefill + 2x A100 decode": (_pd(("h100-sxm", 1), ("a100-80g", 2)), "pd_pair"),
}
HH, HA = "H100 prefill + 2x H100 decode", "H100 prefill + 2x A100 decode"
SMALL = ("2x H100", HH, HA)


def fleet_power(s: RunFigures) -> float | None:
    power = None if (energy := s["energy"]) is None else energy["avg_power_w"]
    return sum(power.values()) if power else None


def arms(scale: str) -> list[Arm]:
    t = traces.chat(int(RATE * DURATION_S[scale]), rate=RATE, seed=3)
    names = SMALL if scale == "small" else tuple(FLEETS)
    return [Arm(n, t, FLEETS[n][0], FLEETS[n][1]) for n in names]


def check(s: dict[str, RunFigures]) -> Verdict:

    def attainment(k: str) -> float:
        return known(slo_figure("attainment")(s[k]), "attainment")

    def meets(k: str) -> bool:
        return attainment(k) >= ATTAINMENT

    def price(k: str) -> float:
        return known(energy_figure("price_per_hour")(s[k]), "price per hour")

    def power(k: str) -> float:
        return known(fleet_power(s[k]), "power")   # both fleets report power

    ok = meets(HH) and meets(HA) and price(HA) < price(HH) and power(HA) < power(HH)
    cheapest = min((k for k in s if meets(k)), key=price, default=None)
    overall = f"; cheapest fleet meeting the SLO overall: {cheapest}, ${price(cheapest):.2f}/h" if cheapest else ""
    return Verdict(ok, f"attainment {attainment(HH):.1%} (HH) vs {attainment(HA):.1%} (HA); "
                       f"${price(HH):.2f}/h -> ${price(HA):.2f}/h, {fleet_power(s[HH]):,.0f} W -> "
                       f"{fleet_power(s[HA]):,.0f} W{overall} (claim: both meet {ATTAINMENT:.0%} attainment, HA "
                       "costs less and draws less power than HH)")


REPRO = Reproduction(
    name="splitwise-hetero-pools",
    title="Splitwise: heterogeneous pools, cost and power at equal SLO",
    source="Patel et al., Splitwise, ISCA 2024, Figures 14-15 (Splitwise-HA: H100 prompt + A100 token machines; "
           "cost and power at iso-throughput); Griggs et al., Melange, 2024 (GPU mixes for cost)",
    claim="At the same SLO, a disaggregated fleet with H100 prompt machines and A100 token machines "
          "(Splitwise-HA) costs less and draws less power than the same shape built from H100s only (Splitwise-HH).",
    setup=f"Chat-like requests (lognormal prompts, median 600 tokens; outputs median 150) at {RATE:g} req/s Poisson "
          "for 60 s, Llama-3-8B. Homogeneous H100 and A100 fleets (least outstanding), a colocated H100 + A100 mix "
          "(`capacity_weighted`), and disaggregated fleets (`pd_pair`). Prices and power from the GPU catalog "
          f"(AWS on-demand per GPU); a fleet meets the SLO when at least {ATTAINMENT:.0%} of requests do. "
          "Not reproduced here: Melange's wider claim that a GPU mix beats every homogeneous fleet on cost. With "
          "the catalog's prices an H100 gives more memory bandwidth per dollar than an A100, so two colocated H100s "
          "are the cheapest fleet meeting this SLO (see the table).",
    arms=arms,
    columns=(Column("attainment", "attainment", slo_figure("attainment"), "{:.1%}"),
             Column("usd_per_hour", "$/h", energy_figure("price_per_hour"), "{:.2f}"),
             Column("power", "fleet power (W)", fleet_power, "{:,.0f}"),
             Column("usd_per_m_good", "$ per M good tokens", energy_figure("usd_per_m_good_tokens"), "{:.3f}"),
             Column("j_per_good", "J per good token", energy_figure("j_per_good_token"), "{:.3f}"),
             Column("tpot.p99", "TPOT p99 (s)", pct("tpot", "p99"))),
    check=check,
    figure="usd_per_hour",
    slo="ttft=1s,tpot=50ms",
)
