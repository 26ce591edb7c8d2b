"""Speculative decoding, two claims.

Leviathan et al. (ICML 2023): with draft tokens accepted i.i.d. at rate a, k drafts per step
and a proposer costing c target steps per draft, a verify step yields (1 - a^(k+1)) / (1 - a)
tokens and decoding speeds up by that over (k c + 1): the gain rises with the acceptance rate,
and with k only while acceptance is high (at low acceptance more drafts are wasted work).

Liu et al., "Optimizing Speculative Decoding for Serving Large Language Models Using Goodput"
(SmartSpec, 2024): the verify step costs k + 1 query tokens per sequence, which is free while
decoding is memory-bound (small batches) and not once the batch makes it compute-bound, so the
gain shrinks as the batch grows and turns into a loss at large batches.
"""

from __future__ import annotations

import numpy as np

from llmlb_bench.repro import traces
from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.repro.base import Arm, Column, Reproduction, Verdict, pct, ratio
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.speculative import expected_tokens

#: the proposer's cost per draft token in target decode steps (a draft model ~1/20 of the target)
COST_RATIO = 0.05
ACCEPTANCE = {"small": (0.5, 0.7, 0.9), "full": (0.3, 0.5, 0.6, 0.7, 0.8, 0.9)}
DRAFTS = {"small": (2, 8), "full": (2, 4, 8)}
#: requests one after another (batch 1), each alone on the replica
SOLO = {"small": 3, "full": 8}
BATCHES = {"small": (1, 32, 256), "full": (1, 8, 32, 64, 128, 256, 512)}
LOAD_K, LOAD_ACCEPTANCE = 4, 0.7


def _cluster(spec: dict[str, object] | None) -> ClusterConfig:
    return ClusterConfig.build(replicas=1, gpu="h100-sxm", model="llama-3-8b", enable_prefix_caching=False,
                               max_num_seqs=1024, speculative=spec)


def _draft(k: int, a: float) -> dict[str, object]:
    return {"method": "draft_model", "cost_ratio": COST_RATIO, "num_speculative_tokens": k, "acceptance": a}


def acceptance_arms(scale: str) -> list[Arm]:
    n = SOLO[scale]
    # 2 s apart: each request (128-token prompt, 256 tokens out) runs alone, at batch 1
    t = traces.table(np.arange(n) * 2.0, 128, 256)
    # plain decoding has no acceptance rate: the same run at every x, drawn as the baseline line
    plain = _cluster(None)
    out = [Arm(f"plain a={a:g}", t, plain, series="plain", x=a) for a in ACCEPTANCE[scale]]
    out += [Arm(f"k={k} a={a:g}", t, _cluster(_draft(k, a)), series=f"k = {k}", x=a)
            for k in DRAFTS[scale] for a in ACCEPTANCE[scale]]
    return out


def leviathan(a: float, k: int) -> float:
    """Leviathan et al.'s expected speed-up (verify step = one target step)."""
    return expected_tokens(a, k) / (k * COST_RATIO + 1)


def _speedups(s: dict[str, RunFigures]) -> dict[tuple[int, float], float]:
    """(k, a) -> plain TPOT / speculative TPOT, from arms labelled ``k=K a=A`` and ``plain a=A``."""
    out = {}
    for label, v in s.items():
        k, a = label.split()
        if k != "plain":
            out[int(k[2:]), float(a[2:])] = ratio(s[f"plain {a}"]["tpot"]["mean"], v["tpot"]["mean"])
    return out


def acceptance_check(s: dict[str, RunFigures]) -> Verdict:
    up = _speedups(s)
    ks = sorted({k for k, _ in up})
    rates = sorted({a for _, a in up})
    rising = all(up[k, a] < up[k, b] for k in ks for a, b in zip(rates, rates[1:]))
    high, low = rates[-1], rates[0]
    more_k_high = all(up[j, high] < up[k, high] for j, k in zip(ks, ks[1:]))
    more_k_low = up[ks[-1], low] < up[ks[0], low] * 1.05       # at low acceptance, more drafts gain little or lose
    worst = max(abs(v / leviathan(a, k) - 1) for (k, a), v in up.items())
    ok = rising and more_k_high and more_k_low and worst < 0.1
    cells = ", ".join(f"k={k} a={a:g}: x{up[k, a]:.2f} (formula x{leviathan(a, k):.2f})"
                      for k in ks for a in (low, high))
    return Verdict(ok, f"batch-1 speed-up (plain TPOT / speculative TPOT) {cells}; largest gap to the formula "
                       f"over all {len(up)} runs {worst:.1%} (claim: rises with acceptance for every k, with k at a = {high:g}, not at "
                       f"a = {low:g}; within 10% of (1 - a^(k+1)) / ((1 - a)(k c + 1)))")


def load_arms(scale: str) -> list[Arm]:
    out = []
    for b in BATCHES[scale]:
        # b requests at once: the batch decodes together (128-token prompts, 256 tokens out)
        t = traces.table(np.zeros(b), 128, 256)
        out.append(Arm(f"plain@{b}", t, _cluster(None), series="plain", x=b))
        out.append(Arm(f"speculative@{b}", t, _cluster(_draft(LOAD_K, LOAD_ACCEPTANCE)),
                       series=f"k = {LOAD_K}, a = {LOAD_ACCEPTANCE:g}", x=b))
    return out


def load_check(s: dict[str, RunFigures]) -> Verdict:
    batches = sorted(int(label.split("@")[1]) for label in s if label.startswith("plain@"))
    gain = {b: ratio(s[f"speculative@{b}"]["output_throughput"], s[f"plain@{b}"]["output_throughput"])
            for b in batches}
    falling = all(gain[a] > gain[b] for a, b in zip(batches, batches[1:]))
    ok = falling and gain[batches[0]] > 2.0 and gain[batches[-1]] < 1.0
    cells = ", ".join(f"batch {b}: x{g:.2f}" for b, g in gain.items())
    return Verdict(ok, f"output throughput speculative / plain: {cells} (claim: the gain falls as the batch grows, "
                       f"above 2x at batch {batches[0]}, below 1x at batch {batches[-1]})")


ACCEPTANCE_REPRO = Reproduction(
    name="speculative-acceptance",
    title="Speculative decoding: speed-up against acceptance rate and draft length",
    source="Leviathan et al., Fast Inference from Transformers via Speculative Decoding, ICML 2023, "
           "Section 3 (expected tokens per step, Eq. 1; walltime improvement, Theorem 3.8) and Figure 3",
    claim="With drafts accepted i.i.d. at rate a, k drafts per step and a proposer costing c target steps per "
          "draft, decoding speeds up by (1 - a^(k+1)) / ((1 - a)(k c + 1)): more with higher acceptance, and "
          "more with larger k only when acceptance is high.",
    setup=f"One H100 replica of Llama-3-8B; requests one at a time (batch 1), 128-token prompts, 256 output "
          f"tokens. A draft-model proposer costing c = {COST_RATIO:g} target decode steps per draft token; "
          "k and the acceptance rate a swept; the speed-up is the plain run's mean TPOT over the speculative "
          "run's.",
    arms=acceptance_arms,
    columns=(Column("tpot.mean", "TPOT mean (s)", pct("tpot", "mean")),
             Column("itl.mean", "ITL mean (s)", pct("itl", "mean")),
             Column("accepted", "mean acceptance length",
                    lambda s: None if (spec := s["speculative"]) is None else spec.get("mean_acceptance_length"),
                    "{:.2f}")),
    check=acceptance_check,
    figure="tpot.mean",
    x_label="acceptance rate a",
)

LOAD_REPRO = Reproduction(
    name="speculative-load",
    title="Speculative decoding: the gain shrinks as the batch grows",
    source="Liu et al., Optimizing Speculative Decoding for Serving Large Language Models Using Goodput "
           "(SmartSpec), 2024, motivation (fixed-length speculation speeds serving up at low request rates and "
           "slows it down at high ones)",
    claim="Verifying k drafts adds k query tokens per sequence to every step: nearly free while decoding is "
          "memory-bound at small batches, a loss once large batches make it compute-bound, so speculative "
          "decoding's gain shrinks with load and turns negative.",
    setup=f"One H100 replica of Llama-3-8B (max_num_seqs 1024); b requests arrive at once and decode together "
          f"(128-token prompts, 256 output tokens), b swept from 1 to 512. Plain decoding vs a draft-model "
          f"proposer with k = {LOAD_K}, acceptance {LOAD_ACCEPTANCE:g} and c = {COST_RATIO:g}; the figure is "
          "output throughput.",
    arms=load_arms,
    columns=(Column("output_throughput", "output tokens/s", lambda s: s["output_throughput"], "{:,.0f}"),
             Column("tpot.mean", "TPOT mean (s)", pct("tpot", "mean")),
             Column("e2e.mean", "E2E mean (s)", pct("e2e", "mean"))),
    check=load_check,
    figure="output_throughput",
    x_label="batch size (requests decoding together)",
)
