"""Rewards and constraint costs of the routing environment, named in one place.

A request's reward is known only when it ends: the backend hands the policy its
:class:`~llmlb_bench.policies.base.Outcome` with ``on_complete``, and the
environment turns it into a number here and attributes it to the decision that
routed it (``info["completed"]`` of the step during which it ended). Requests
the router refused (REJECT) or still held when the episode ended never reach a
target; they count as failures (status ``rejected`` / ``not_sent``).

Per-request terms (:data:`REQUEST_TERMS`), with the run's SLO in the ``--slo``
syntax (``metrics/slo.py``: ttft, tpot, e2e limits, per ``slo_class``):

* ``slo_met``: 1 when the request is ok and meets every limit of its class, else 0;
  the episode's sum is the goodput count of docs/metrics.md.
* ``good_tokens``: output tokens / 1000 of requests that meet their SLO, else 0.
* ``neg_latency``: minus the end-to-end latency in seconds (a failure counts as
  ``failure_s``).
* ``neg_ttft``: minus the time to first token in seconds (a failure: ``failure_s``).

Episode terms (:data:`EPISODE_TERMS`), paid at the last step, because they are
properties of the whole run rather than of one request:

* ``fairness``: Jain's index (0..1) over tenants of each tenant's share of
  requests that met their SLO (1 with one tenant).
* ``energy_per_good_token``: minus the fleet's energy in joules per SLO-meeting
  output token (the simulator's whole-fleet energy, idle power included).

A reward is a weighted sum: ``"slo_met"`` or ``"good_tokens=1,fairness=0.5"``.

Constraint costs (:data:`COSTS`, summed per step into ``info["cost"]`` for
constrained RL): ``slo_violation`` (1 per ended request that missed its SLO or
failed), ``failed`` (1 per request that ended with a status other than ok,
router refusals included), ``ttft_excess_s`` (seconds of TTFT beyond its limit,
0 where the class has no TTFT limit; a failure counts ``failure_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.slo import Slo


class Ended(NamedTuple):
    """One request as it ended, on the router's clock: what the reward terms read (a tuple: one is
    made per request)."""

    status: str                 # ok, error, timeout, rejected, not_sent
    slo_class: str
    tenant: str
    ttft_s: float | None        # None: no token came
    e2e_s: float
    tpot_s: float               # 0 for one output token (vLLM counts those as meeting any TPOT limit)
    output_tokens: int


#: name -> what one ended request is worth; arguments: the request, its SLO limits, whether it met
#: them, and the failure latency in seconds
REQUEST_TERMS: dict[str, Callable[[Ended, bool, float], float]] = {
    "slo_met": lambda e, met, fail_s: 1.0 if met else 0.0,
    "good_tokens": lambda e, met, fail_s: e.output_tokens / 1000.0 if met else 0.0,
    "neg_latency": lambda e, met, fail_s: -(e.e2e_s if e.status == "ok" else fail_s),
    "neg_ttft": lambda e, met, fail_s: -(e.ttft_s if e.status == "ok" and e.ttft_s is not None else fail_s),
}
#: episode-level terms (paid at the last step); see the module docstring
EPISODE_TERMS = ("fairness", "energy_per_good_token")
#: constraint costs reported per step in ``info["cost"]``
COSTS = ("slo_violation", "failed", "ttft_excess_s")
#: terms that need an SLO to mean anything
_NEEDS_SLO = {"slo_met", "good_tokens", "fairness", "energy_per_good_token"}
#: SLO metrics an Outcome lets the environment measure (the answer's timing needs reasoning counts it lacks)
MEASURABLE = ("ttft", "tpot", "e2e")


def parse_weights(spec: str | Mapping[str, float], where: str = "--reward") -> dict[str, float]:
    """``"slo_met"`` or ``"good_tokens=1,fairness=0.5"`` (or such a mapping) -> term -> weight."""
    if isinstance(spec, str):
        weights: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, value = part.partition("=")
            try:
                weights[name.strip()] = float(value) if sep else 1.0
            except ValueError:
                raise UserError(f"cannot read weight {value!r} of {name.strip()!r}; expected e.g. "
                                f"slo_met=1,fairness=0.5", where) from None
    else:
        weights = {str(k): float(v) for k, v in spec.items()}
    known = list(REQUEST_TERMS) + list(EPISODE_TERMS)
    for name, w in weights.items():
        if name not in known:
            raise UserError(f"unknown reward term {name!r} (known: {', '.join(known)})", where)
        if not math.isfinite(w):
            raise UserError(f"weight of {name!r} must be finite", where)
    if not weights:
        raise UserError(f"names no reward term (known: {', '.join(known)})", where)
    return weights


@dataclass
class Reward:
    """A weighted sum of terms against an SLO; keeps the episode's books for the episode terms."""

    weights: dict[str, float]
    slo: Slo | None
    failure_s: float = 60.0
    #: per tenant: [requests ended, requests that met their SLO]
    _tenants: dict[str, list[int]] = field(default_factory=dict)
    _good_tokens: int = 0
    #: per slo_class: its (ttft, tpot, e2e) limits, inf where it has none (filled as classes show up)
    _limits: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str | Mapping[str, float], slo: str | Slo | None, failure_s: float = 60.0,
              where: str = "--reward") -> "Reward":
        weights = parse_weights(spec, where)
        parsed = Slo.parse(slo) if isinstance(slo, str) else slo
        need = sorted(set(weights) & _NEEDS_SLO)
        if need and parsed is None:
            raise UserError(f"reward term {need[0]!r} needs an SLO (--slo, e.g. ttft=500ms,tpot=50ms)", where)
        if parsed is not None:
            for _, limits in ((None, parsed.limits),) + parsed.classes:
                for metric, _v in limits:
                    if metric not in MEASURABLE:
                        raise UserError(f"SLO metric {metric!r} cannot be measured per request in the environment "
                                        f"(measurable: {', '.join(MEASURABLE)})", "--slo")
        if not (failure_s > 0 and math.isfinite(failure_s)):
            raise UserError("failure_s must be a positive number of seconds", where)
        return cls(weights, parsed, failure_s)

    def __post_init__(self) -> None:
        self._terms = [(REQUEST_TERMS[name], w) for name, w in self.weights.items() if name in REQUEST_TERMS]

    def reset(self) -> None:
        """A new episode: forget the books of the last one."""
        self._tenants = {}
        self._good_tokens = 0

    def limits(self, slo_class: str) -> tuple[float, float, float]:
        """The (ttft, tpot, e2e) limits of ``slo_class`` in seconds (inf: no limit)."""
        got = self._limits.get(slo_class)
        if got is None:
            d = self.slo.limits_for(slo_class) if self.slo is not None else {}
            got = self._limits[slo_class] = (d.get("ttft", math.inf), d.get("tpot", math.inf),
                                             d.get("e2e", math.inf))
        return got

    def ended(self, e: Ended, cost: dict[str, float]) -> float:
        """The reward of one ended request; adds its constraint costs to ``cost``."""
        ttft_limit, tpot_limit, e2e_limit = self.limits(e.slo_class)
        ok = e.status == "ok"
        ttft = e.ttft_s
        met = ok and ttft is not None and ttft <= ttft_limit and e.tpot_s <= tpot_limit and e.e2e_s <= e2e_limit
        books = self._tenants.get(e.tenant)
        if books is None:
            books = self._tenants[e.tenant] = [0, 0]
        books[0] += 1
        if met:
            books[1] += 1
            self._good_tokens += e.output_tokens
        else:
            cost["slo_violation"] += 1.0
        if not ok:
            cost["failed"] += 1.0
        if ttft_limit < math.inf:
            late = (ttft if ok and ttft is not None else self.failure_s) - ttft_limit
            if late > 0:
                cost["ttft_excess_s"] += late
        fail_s = self.failure_s
        total = 0.0
        for term, w in self._terms:
            total += w * term(e, met, fail_s)
        return total

    def episode(self, energy_j: float) -> dict[str, float]:
        """The episode terms' values (unweighted) at the end of an episode that used ``energy_j``."""
        shares = [good / n for n, good in self._tenants.values() if n]
        jain = (sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares))
                if shares and any(shares) else 0.0)
        per_token = energy_j / self._good_tokens if self._good_tokens else energy_j
        return {"fairness": jain, "energy_per_good_token": -per_token}

    def episode_reward(self, energy_j: float) -> float:
        values = self.episode(energy_j)
        return sum(w * values[name] for name, w in self.weights.items() if name in values)


def zero_costs() -> dict[str, float]:
    return dict.fromkeys(COSTS, 0.0)
