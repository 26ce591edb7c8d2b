"""Predicted-length shortest-job-first (e.g. Fu et al., "Efficient LLM Scheduling by Learning to
Rank", NeurIPS 2024; Qiu et al., "Efficient Interactive LLM Serving with Proxy Model-based
Sequence Length Prediction", 2024): ordering the queue by predicted output length lowers mean
latency in proportion to how well the predictor ranks requests (its Kendall tau); a predictor
that ranks at random is no better than FCFS."""

from __future__ import annotations

import numpy as np

from llmlb_bench.repro import traces
from llmlb_bench.repro.base import Arm, Column, Reproduction, Verdict, pct, ratio
from llmlb_bench.sim import ClusterConfig

REQUESTS = {"small": 500, "full": 800}
TAUS = {"small": (0.0, 0.9), "full": (0.0, 0.3, 0.6, 0.9, 1.0)}


def arms(scale: str) -> list[Arm]:
    # one replica with 8 seats offered 6 req/s of heavy-tailed outputs: a queue builds up to reorder
    n = REQUESTS[scale]
    rng = np.random.default_rng(1)
    t = traces.table(traces.poisson(rng, 6.0, n), 200, traces.lognormal(rng, 100, 1.0, n, 2000))
    out = [Arm("fcfs", t, ClusterConfig.build(replicas=1, max_num_seqs=8))]
    out += [Arm(f"sjf tau={tau:g}", t, ClusterConfig.build(replicas=1, max_num_seqs=8, scheduler="sjf",
                                                      scheduler_args={"tau": tau})) for tau in TAUS[scale]]
    return out


def check(s: dict) -> Verdict:
    fcfs = s["fcfs"]["e2e"]["mean"]
    taus = sorted(float(k.split("=")[1]) for k in s if k.startswith("sjf"))
    e2e = [s[f"sjf tau={t:g}"]["e2e"]["mean"] for t in taus]
    noise, good = ratio(e2e[0], fcfs), ratio(s["sjf tau=0.9"]["e2e"]["mean"], fcfs)
    monotone = all(b <= 1.05 * a for a, b in zip(e2e, e2e[1:]))
    ok = abs(noise - 1) < 0.1 and good < 0.6 and monotone
    words = ", ".join(f"tau {t:g}: {v:.1f} s" for t, v in zip(taus, e2e))
    return Verdict(ok, f"mean E2E FCFS {fcfs:.1f} s; SJF {words} (claim: tau 0 within 10% of FCFS, tau 0.9 below "
                       "0.6x FCFS, never rising by more than 5% as tau grows)")


REPRO = Reproduction(
    name="sjf-predictor-quality",
    title="Predicted-length SJF: latency gain vs predictor quality (Kendall tau)",
    source="Fu et al., Efficient LLM Scheduling by Learning to Rank, NeurIPS 2024, Figure 1 and Table 2 "
           "(latency vs Kendall tau of the ranking predictor)",
    claim="Shortest-predicted-job-first lowers mean latency, and the gain grows with the predictor's Kendall "
          "tau against the true output length; at tau 0 it is FCFS.",
    setup="One A100-80G replica of Llama-3-8B with 8 batch seats, offered 6 req/s Poisson; prompts 200 tokens, "
          "outputs lognormal (median 100, sigma 1, at most 2,000). Engine scheduler FCFS vs `sjf` with an oracle "
          "predictor of Kendall tau 0-1 (aging 10 predicted tokens per second of waiting).",
    arms=arms,
    columns=(Column("e2e.mean", "E2E mean (s)", pct("e2e", "mean")),
             Column("e2e.p99", "E2E p99 (s)", pct("e2e", "p99")),
             Column("ttft.mean", "TTFT mean (s)", pct("ttft", "mean"))),
    check=check,
    figure="e2e.mean",
)
