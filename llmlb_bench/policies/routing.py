"""Classic routing policies: load-oblivious (random, round-robin) and
load-aware (JSQ, least tokens, power of d).

The load-aware ones read ``view.outstanding_requests`` / ``outstanding_tokens``,
which the router keeps itself and which are therefore exact and fresh, like
the in-flight counters of the SGLang router or Envoy's least-request balancer.
With ``load="scraped"``, JSQ and power of d instead read the queue the targets
report (waiting + running, as last scraped): what a router that only sees the
engines' metrics has, stale by the scrape interval. JSQ on stale signals herds
(Mitzenmacher, "How useful is old information?", 2000): every request between
two scrapes joins the same queue, the one that looked shortest; sampling two
at random spreads them.
"""

from __future__ import annotations

from random import Random
from typing import Sequence

from llmlb_bench.policies.base import Picked, Policy, RouteRequest, View
from llmlb_bench.policies.books import QUEUE, REQUESTS, WAITING, Cycle, Fewest, Uniform
from llmlb_bench.policies.select import argmin_healthy

#: load measures of JSQ / power of d: the router's own count, or the targets' scraped queues
LOADS = ("requests", "tokens", "scraped")


def _check_load(load: str, allowed: tuple[str, ...]) -> None:
    if load not in allowed:
        raise ValueError(f"load must be one of {', '.join(allowed)} (got {load!r})")


class RandomChoice(Picked):
    name = "random"
    summary = "Uniformly random healthy target; the load-oblivious baseline."
    params = {"seed": (0, "seed of the policy's own random stream")}

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.pick = Uniform(seed)


class RoundRobin(Picked):
    name = "round_robin"
    summary = "Cycle through healthy targets in order; ignores load."

    def __init__(self) -> None:
        self.pick = Cycle()


class LeastOutstanding(Picked):
    name = "least_outstanding"
    summary = "Join the shortest queue: fewest in-flight requests by the router's own count (JSQ)."
    params = {"load": ("requests", "queue measure: requests (own count, exact) or scraped (waiting + running "
                                   "as the targets last reported; stale with the refresh interval)")}

    def __init__(self, load: str = "requests") -> None:
        _check_load(load, ("requests", "scraped"))
        self.load = load
        self.pick = Fewest(REQUESTS if load == "requests" else QUEUE, rotate=True)


class FewestWaiting(Picked):
    """Vidur's ``lor`` global scheduler (``benchmarks/sim_vs_vidur.py`` runs it against Vidur)."""

    name = "fewest_waiting"
    summary = ("Fewest waiting (queued, not yet running) requests as the targets last reported; ties to "
               "the lowest index (Vidur's lor).")

    def __init__(self) -> None:
        self.pick = Fewest(WAITING, rotate=False)


class LeastTokens(Policy):
    name = "least_tokens"
    summary = "Fewest outstanding tokens (prompt + requested output of in-flight requests, own count)."

    def __init__(self) -> None:
        self._tie = 0

    def choose(self, req: RouteRequest, view: View) -> int:
        self._tie += 1
        return argmin_healthy(view.outstanding_tokens, view, self._tie)


class PowerOfD(Policy):
    """Sample ``d`` distinct healthy targets, send to the least loaded of them.

    Mitzenmacher's power of two choices: with d = 2 the maximum queue drops
    from log n / log log n to log log n, at the cost of reading only two
    counters (SGLang router ``power_of_two``: in-flight requests, first
    sampled wins ties).
    """

    name = "power_of_d"
    summary = "Sample d targets at random, pick the one with the fewest in-flight requests (or tokens)."
    params = {
        "d": (2, "targets sampled per decision"),
        "load": ("requests", "load measure: requests or tokens (own accounting), or scraped "
                             "(waiting + running as last reported)"),
        "seed": (0, "seed of the policy's own random stream"),
    }

    def __init__(self, d: int = 2, load: str = "requests", seed: int = 0) -> None:
        if d < 1:
            raise ValueError(f"d must be >= 1 (got {d})")
        _check_load(load, LOADS)
        self.d, self.load, self.seed = d, load, seed
        self._rng = Random(seed)

    def choose(self, req: RouteRequest, view: View) -> int:
        if self.load == "scraped":
            loads: Sequence[int] = [w + r for w, r in zip(view.waiting, view.running)]
        else:
            loads = view.outstanding_requests if self.load == "requests" else view.outstanding_tokens
        n = len(view)
        if all(view.healthy):
            pool: range | list[int] = range(n)
        else:
            pool = [i for i in range(n) if view.healthy[i]] or range(n)
        picks = self._rng.sample(pool, min(self.d, len(pool)))
        best = picks[0]
        for i in picks[1:]:
            if loads[i] < loads[best]:
                best = i
        return best
