"""Sarathi-Serve (Agrawal et al., OSDI 2024): splitting long prefills into chunks that share a
token budget with running decodes bounds the stall a prefill puts on them, so TPOT and
inter-token tails drop, at some cost in TTFT (a prompt takes several iterations)."""

from __future__ import annotations

import numpy as np

from llmlb_bench.repro import traces
from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.repro.base import Arm, Column, Reproduction, Verdict, pct, ratio
from llmlb_bench.sim import ClusterConfig

REQUESTS = {"small": 250, "full": 800}
CHUNKS = {"small": (512,), "full": (2048, 512, 256)}


def arms(scale: str) -> list[Arm]:
    # 20% of prompts are 7,000 tokens long, the rest 100-400: long prefills land among running decodes
    n = REQUESTS[scale]
    rng = np.random.default_rng(0)
    arrival = traces.poisson(rng, 4.0, n)
    prompt = np.where(rng.random(n) < 0.2, 7000, rng.integers(100, 400, n))
    t = traces.table(arrival, prompt, rng.integers(100, 300, n))
    out = [Arm("whole prefill", t, ClusterConfig.build(replicas=1, chunked_prefill=False))]
    out += [Arm(f"chunks of {c}", t, ClusterConfig.build(replicas=1, max_num_batched_tokens=c)) for c in CHUNKS[scale]]
    return out


def check(s: dict[str, RunFigures]) -> Verdict:
    whole, chunked = s["whole prefill"], s["chunks of 512"]
    tpot = ratio(chunked["tpot"]["p99"], whole["tpot"]["p99"])
    itl = ratio(chunked["itl"]["p99"], whole["itl"]["p99"])
    ttft = ratio(chunked["ttft"]["mean"], whole["ttft"]["mean"])
    ok = tpot < 0.8 and itl < 0.3 and ttft > 1.05
    return Verdict(ok, f"chunks of 512 vs whole prefills: TPOT p99 x{tpot:.2f}, ITL p99 x{itl:.2f}, mean TTFT "
                       f"x{ttft:.2f} (claim: TPOT p99 below 0.8x, ITL p99 below 0.3x, TTFT higher by 5% or more)")


REPRO = Reproduction(
    name="sarathi-chunked-prefill",
    title="Sarathi-Serve: chunked prefill trades TTFT for lower TPOT tails",
    source="Agrawal et al., Sarathi-Serve, OSDI 2024, Figures 1 and 11 (generation stalls; TBT tails vs chunk size)",
    claim="Chunked prefills with a per-iteration token budget remove the generation stalls long prompts cause, "
          "lowering TPOT and inter-token-latency tails; TTFT rises because a prompt spans several iterations.",
    setup="One A100-80G replica of Llama-3-8B; Poisson arrivals at 4 req/s, 20% of prompts 7,000 tokens and the "
          "rest 100-400, outputs 100-300 tokens. Whole prefills (`chunked_prefill = false`) vs chunked prefill "
          "with a token budget (`max_num_batched_tokens`) of 2,048, 512 and 256.",
    arms=arms,
    columns=(Column("itl.p99", "ITL p99 (s)", pct("itl", "p99")),
             Column("tpot.p99", "TPOT p99 (s)", pct("tpot", "p99")),
             Column("ttft.mean", "TTFT mean (s)", pct("ttft", "mean")),
             Column("ttft.p99", "TTFT p99 (s)", pct("ttft", "p99"))),
    check=check,
    figure="itl.p99",
)
