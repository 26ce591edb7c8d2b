"""SGLang (Zheng et al., NeurIPS 2024) cache-aware routing: sending a request to the replica
whose radix tree already holds its longest prefix raises the prefix cache hit rate, and with
it throughput and TTFT, over round robin on shared-prefix traffic."""

from __future__ import annotations

from typing import Literal

from llmlb_bench.repro import traces
from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.repro.base import Arm, Column, Getter, Reproduction, Verdict, hit_rate, known, pct, ratio
from llmlb_bench.sim import ClusterConfig

NOMINAL_RATE = 3.0  # req/s offered by workloads/shared-prefix.toml
# preset rate multipliers and request counts
LOADS = {"small": (25.0,), "full": (25.0, 50.0)}
REQUESTS = {"small": 800, "full": 2000}
POLICIES = ("round_robin", "least_outstanding", "cache_aware")


def cache(bucket: Literal["offered", "routing", "eviction", "stale", "in_flight"]) -> Getter:
    """A bucket of the run's prefix-cache accounting (docs/prefix-cache.md), a share of prompt tokens."""
    return lambda s: None if (accounting := s["prefix_cache"]) is None else accounting[bucket]


def predicted_hit_rate(s: RunFigures) -> float | None:
    """The hit rate the router predicted, where it predicted any (docs/prefix-cache.md)."""
    predicted = None if (accounting := s["prefix_cache"]) is None else accounting["predicted"]
    return None if predicted is None else predicted["hit_rate_predicted"]


def arms(scale: str) -> list[Arm]:
    cluster = ClusterConfig.build(replicas=4)
    out = []
    for load in LOADS[scale]:
        t = traces.preset("shared-prefix", seed=1, rate_scale=load, requests=REQUESTS[scale])
        out += [Arm(f"{p}@{load:g}x", t, cluster, p, series=p, x=load * NOMINAL_RATE) for p in POLICIES]
    return out


def check(s: dict[str, RunFigures]) -> Verdict:
    load = max(float(k.split("@")[1][:-1]) for k in s)
    rr, ca = s[f"round_robin@{load:g}x"], s[f"cache_aware@{load:g}x"]
    dh = known(hit_rate(ca), "prefix hit rate") - known(hit_rate(rr), "prefix hit rate")   # both runs served prompts
    thr = ratio(ca["request_throughput"], rr["request_throughput"])
    ttft = ratio(ca["ttft"]["mean"], rr["ttft"]["mean"])
    ok = dh >= 0.05 and thr >= 1.0 and ttft <= 0.7
    offered, lost = cache("offered")(rr), cache("routing")(rr)
    why = (f"; of the {offered:.1%} the trace offers, round robin loses {lost:.1%} to routing, cache-aware "
           f"{cache('routing')(ca):.1%}" if offered is not None and lost is not None else "")
    return Verdict(ok, f"at {load * NOMINAL_RATE:g} req/s cache-aware vs round robin: prefix hit rate {hit_rate(rr):.1%} -> "
                       f"{hit_rate(ca):.1%}, throughput x{thr:.3f}, mean TTFT x{ttft:.2f}{why} (claim: hit rate +5 points "
                       "or more, throughput not lower, mean TTFT at most 0.7x)")


REPRO = Reproduction(
    name="sglang-cache-aware",
    title="SGLang: cache-aware routing vs round robin on shared prefixes",
    source="Zheng et al., SGLang, NeurIPS 2024, Section 4 and Figure 9 (cache-aware load balancing)",
    claim="Routing to the replica with the longest cached prefix raises the prefix hit rate and throughput "
          "and lowers TTFT compared with load-oblivious round robin.",
    setup="Preset `workloads/shared-prefix.toml` (multi-turn sessions over 50 Zipf-popular system prompts of "
          "300-2,000 tokens) at 25x and 50x its nominal 3 req/s. Four A100-80G replicas of Llama-3-8B with "
          "prefix caching. Round robin, least outstanding and SGLang's `cache_aware` (defaults).",
    arms=arms,
    columns=(Column("hit_rate", "prefix hit rate", hit_rate, "{:.1%}"),
             Column("throughput", "throughput (req/s)", lambda s: s["request_throughput"]),
             Column("ttft.mean", "TTFT mean (s)", pct("ttft", "mean")),
             Column("ttft.p99", "TTFT p99 (s)", pct("ttft", "p99")),
             Column("cache.offered", "offered", cache("offered"), "{:.1%}"),
             Column("cache.routing", "lost to routing", cache("routing"), "{:.1%}"),
             Column("cache.eviction", "lost to eviction", cache("eviction"), "{:.1%}"),
             Column("cache.stale", "lost to a stale index", cache("stale"), "{:.1%}"),
             Column("cache.in_flight", "lost in flight", cache("in_flight"), "{:.1%}"),
             Column("cache.predicted", "router predicted", predicted_hit_rate, "{:.1%}")),
    check=check,
    figure="hit_rate",
    x_label="offered rate (req/s)",
)
