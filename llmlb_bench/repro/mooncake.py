"""Mooncake (Qin et al., FAST 2025): under overload, rejecting a request at arrival when its
predicted TTFT already misses the SLO keeps goodput near capacity, where admitting everything
lets the queue grow until almost no request meets its SLO."""

from __future__ import annotations

from llmlb_bench.repro import traces
from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.repro.base import Arm, Column, Reproduction, Verdict, known, pct, slo_figure
from llmlb_bench.sim import ClusterConfig

RATES = {"small": (30.0, 90.0), "full": (30.0, 60.0, 90.0, 120.0)}
DURATION_S = {"small": 15.0, "full": 60.0}
TTFT_SLO_S = 2.0
POLICIES: tuple[tuple[str, str, dict[str, object]], ...] = (("least_outstanding", "least_outstanding", {}),
            ("min_ttft_admit_all", "predicted_ttft", {}),
            ("early_reject", "predicted_ttft", {"ttft_slo_s": TTFT_SLO_S}))


def arms(scale: str) -> list[Arm]:
    cluster = ClusterConfig.build(replicas=4)
    out = []
    for rate in RATES[scale]:
        t = traces.chat(int(rate * DURATION_S[scale]), rate=rate, seed=2)
        out += [Arm(f"{label}@{rate:g}", t, cluster, p, a, series=label, x=rate) for label, p, a in POLICIES]
    return out


def check(s: dict[str, RunFigures]) -> Verdict:
    top = max(float(k.split("@")[1]) for k in s)
    def goodput(k: str) -> float:
        return known(slo_figure("goodput")(s[k]), "goodput")

    admit, reject = f"min_ttft_admit_all@{top:g}", f"early_reject@{top:g}"
    best = max(goodput(k) for k in s if k.startswith("early_reject"))
    ok = goodput(reject) > 2 * goodput(admit) and goodput(reject) >= 0.6 * best
    return Verdict(ok, f"at {top:g} req/s goodput of the same router admitting all {goodput(admit):.1f} vs early rejection "
                       f"{goodput(reject):.1f} good req/s ({s[reject]['rejected']} of {s[reject]['requests']} rejected); "
                       f"early rejection's best goodput over the sweep {best:.1f} (claim: early rejection above 2x "
                       "admit-all at the highest rate and at least 60% of its own best)")


REPRO = Reproduction(
    name="mooncake-early-rejection",
    title="Mooncake: early rejection keeps goodput under overload",
    source="Qin et al., Mooncake, FAST 2025, Section 7 and Figure 13 (prediction-based early rejection)",
    claim="Rejecting requests whose predicted TTFT misses the SLO as they arrive holds goodput near capacity "
          "under overload; admitting all of them collapses goodput as the queue grows.",
    setup="Chat-like requests (lognormal prompts, median 600 tokens; outputs median 150) arriving Poisson for "
          "60 s at 30-120 req/s on four A100-80G replicas of Llama-3-8B. Least outstanding and Mooncake's conductor "
          "(`predicted_ttft`, route to the least predicted TTFT) admitting everything, vs the conductor rejecting "
          f"at arrival when the best predicted TTFT exceeds {TTFT_SLO_S:g} s. Rejected requests count as missing the SLO. "
          "The conductor predicts TTFT as queue plus uncached prefill (10,000 tokens/s); it does not see decode "
          "interference, so in long, deep overload (120 req/s, 3x capacity) it admits too much, the served TTFT "
          "tail drifts past the SLO and goodput falls below its peak: the check asks for 60% of the peak, not all.",
    arms=arms,
    columns=(Column("goodput", "goodput (req/s)", slo_figure("goodput")),
             Column("attainment", "attainment", slo_figure("attainment"), "{:.1%}"),
             Column("rejected", "rejected", lambda s: s["rejected"], "{:,}"),
             Column("ttft.p99", "TTFT p99 of served (s)", pct("ttft", "p99"))),
    check=check,
    figure="goodput",
    x_label="offered rate (req/s)",
    slo=f"ttft={TTFT_SLO_S:g}s,tpot=100ms",
)
