"""LoRA-affinity routing (Gateway API Inference Extension; dLoRA, OSDI 2024): with many adapters of
skewed popularity and a few adapter slots per replica, routing a request to a replica whose batch
already runs its adapter, else one with a free slot, loads adapters less often and waits less for
slots than routing by load alone. The saving in loads is largest while the fleet's slots can hold
the adapters in play; with far more adapters than slots, loads become unavoidable under either.
With no more adapters than one replica's slots nothing contends, and affinity only concentrates
the popular adapters' load: that point is run and shown, and not part of the claim."""

from __future__ import annotations

import pyarrow as pa

from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.repro.base import Arm, Column, Reproduction, Verdict, pct, ratio
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.workload import generate
from llmlb_bench.workload.spec import WorkloadSpec

#: adapter counts swept per preset, and requests per run
ADAPTERS = {"small": (8, 32), "full": (4, 8, 16, 32, 64)}
REQUESTS = {"small": 1500, "full": 4000}
RATE = 20.0          # req/s offered to the four replicas
ZIPF_S = 1.1
POLICIES = ("least_outstanding", "lora_affinity")
#: GIE's weighted profile with the lora-affinity scorer at the queue and KV scorers' weight (2; no
#: prefix scorer: the prompts share nothing): shown beside the two, not part of the claim
SCORED = ("llm_d+lora", "llm_d", {"prefix_weight": 0.0, "lora_weight": 2.0})
REPLICAS, MAX_LORAS = 4, 4
#: adapter slots in the whole fleet
SLOTS = REPLICAS * MAX_LORAS


def chat_over_adapters(adapters: int, requests: int, seed: int = 1) -> pa.Table:
    """Chat traffic at RATE over ``adapters`` adapters of Zipf(ZIPF_S) popularity (workload/adapters.py)."""
    spec = WorkloadSpec.from_dict({"seed": seed, "requests": requests, "tenants": {"chat": {
        "arrival": {"process": "poisson", "rate": RATE},
        "input": {"dist": "lognormal", "median": 500, "sigma": 0.7, "max": 4000},
        "output": {"dist": "lognormal", "median": 120, "sigma": 0.7, "max": 1000},
        "adapters": {"count": adapters, "zipf_s": ZIPF_S}}}})
    return generate(spec)


def loads(s: RunFigures) -> float | None:
    return None if (adapters := s["adapter_loads"]) is None else adapters["total"]


def arms(scale: str) -> list[Arm]:
    cluster = ClusterConfig.build(replicas=REPLICAS, gpu="a100-80g", model="llama-3-8b", max_loras=MAX_LORAS,
                                  max_cpu_loras=16)
    out = []
    for k in ADAPTERS[scale]:
        t = chat_over_adapters(k, REQUESTS[scale])
        out += [Arm(f"{p}@{k}", t, cluster, p, series=p, x=float(k)) for p in POLICIES]
        label, policy, args = SCORED
        out.append(Arm(f"{label}@{k}", t, cluster, policy, args, series=label, x=float(k)))
    return out


def check(s: dict[str, RunFigures]) -> Verdict:
    counts = sorted({int(k.split("@")[1]) for k in s})
    ttft = {k: ratio(s[f"lora_affinity@{k}"]["ttft"]["mean"], s[f"least_outstanding@{k}"]["ttft"]["mean"])
            for k in counts}
    load = {k: ratio(loads(s[f"lora_affinity@{k}"]), loads(s[f"least_outstanding@{k}"])) for k in counts}
    # the claim is about adapters contending for slots: more of them than one replica holds
    contended = [k for k in counts if k > MAX_LORAS]
    ok = bool(contended) and all(ttft[k] <= 0.7 and load[k] < 1.0 for k in contended) and \
        all(load[k] <= 0.5 for k in contended if k <= SLOTS)
    scored = {k: ratio(s[f"{SCORED[0]}@{k}"]["ttft"]["mean"], s[f"least_outstanding@{k}"]["ttft"]["mean"])
              for k in counts}
    parts = ", ".join(f"{k} adapters: mean TTFT x{ttft[k]:.2f} (llm_d with the scorer x{scored[k]:.2f}), "
                      f"loads x{load[k]:.2f}" for k in counts)
    return Verdict(ok, f"lora_affinity vs least_outstanding at {RATE:g} req/s, Zipf({ZIPF_S:g}) popularity: {parts} "
                       f"(claim, for more adapters than a replica's {MAX_LORAS} slots: mean TTFT at most 0.7x and "
                       f"fewer loads; at most 0.5x the loads while the adapters fit the fleet's {SLOTS} slots)")


REPRO = Reproduction(
    name="lora-affinity",
    title="LoRA-affinity routing vs load-only routing over many adapters",
    source="Gateway API Inference Extension, lora-affinity scorer and LoRA section of its model server protocol "
           "(kubernetes-sigs/gateway-api-inference-extension, docs/proposals/003-model-server-protocol); "
           "Wu et al., dLoRA, OSDI 2024, Section 2 (skewed adapter popularity and where requests go)",
    claim="Sending a request where its adapter is already active (else where a slot is free) avoids adapter loads "
          "and the wait for an adapter slot, so where adapters outnumber a replica's slots it lowers TTFT and the "
          "number of adapter loads against routing by load alone, which spreads every adapter over every replica.",
    setup=f"Chat traffic at {RATE:g} req/s (lognormal prompts, median 500 tokens, outputs median 120) over 4 to 64 "
          f"LoRA adapters of Zipf({ZIPF_S:g}) popularity. Four A100-80G replicas of Llama-3-8B, each like vLLM "
          "with --max-loras 4 --max-cpu-loras 16 and rank-16 adapters (84 MB; sim/lora.py). Least outstanding "
          "requests vs GIE's lora-affinity (`lora_affinity`); beside them, not part of the claim, GIE's weighted "
          "profile with the lora-affinity scorer (`llm_d`, queue 2 + KV 2 + lora 2, no prefix scorer).",
    arms=arms,
    columns=(Column("ttft.mean", "TTFT mean (s)", pct("ttft", "mean")),
             Column("ttft.p99", "TTFT p99 (s)", pct("ttft", "p99")),
             Column("loads", "adapter loads", loads, "{:,.0f}"),
             Column("throughput", "throughput (req/s)", lambda s: s["request_throughput"])),
    check=check,
    figure="ttft.mean",
    x_label="LoRA adapters",
)
