"""Robustness curves: goodput and tail latency as one thing a policy relies on degrades.

A sweep's ``[robustness]`` section runs every (workload, cluster, policy) at one offered rate
while one knob moves away from the ideal, the others held there:

* ``signal_refresh_s``: how stale the scraped queue and KV signals are (the cluster's scrape
  interval; 0 = fresh at every event). The power-of-two herding reproduction (Mitzenmacher, *How
  Useful Is Old Information?*, 2000) is this knob's cell for JSQ, power of two and random;
* ``tau``: the Kendall tau of the oracle length predictor (1 = perfect, 0 = useless), passed to
  the policies that take a ``tau`` parameter (``least_predicted_work``, ``predicted_sjf``) and
  not run for the others, whose runs would not change;
* ``slowdown``: the factor by which one replica (``slow_target``) slows from ``slow_at_s`` on
  (cluster ``slowdowns``), as a throttled GPU or a noisy neighbour would; 1 = none.

Each point is an ordinary stored run (phase ``robust``, axis = the knob), summarised as the grid's
cells are, so ``llmlb report`` and ``llmlb query`` read them and a rerun skips finished ones.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from typing import Mapping

from llmlb_bench.policies.registry import policy_class
from llmlb_bench.sweep.cells import Cell
from llmlb_bench.workload.fields import Section

#: the knobs, in the order their curves are shown
KNOBS = ("signal_refresh_s", "tau", "slowdown")


@dataclass(frozen=True)
class RobustnessSpec:
    rate: float
    knobs: tuple[tuple[str, tuple[float, ...]], ...]
    slow_target: str = "r0"
    slow_at_s: float = 0.0


def parse_robustness(s: Section | None) -> RobustnessSpec | None:
    """``[robustness]``: ``rate``, and one or more knobs with their values."""
    if s is None:
        return None
    rate = s.number("rate", gt=0)
    knobs = []
    for knob in KNOBS:
        if s.has(knob):
            if knob == "tau":
                values = s.numbers(knob, ge=-1)
                if max(values) > 1:
                    raise s.error(knob, "a Kendall tau lies in [-1, 1]")
            elif knob == "slowdown":
                values = s.numbers(knob, gt=0)
            else:
                values = s.numbers(knob, ge=0)
            if len(set(values)) != len(values):
                raise s.error(knob, "values repeat")
            knobs.append((knob, tuple(values)))
    target = s.string("slow_target", "r0")
    at = s.number("slow_at_s", 0.0, ge=0)
    s.finish()
    if not knobs:
        raise s.error(None, f"give at least one knob: {', '.join(KNOBS)} (a list of values)")
    return RobustnessSpec(rate, tuple(knobs), target, at)


def takes_tau(policy: str) -> bool:
    return "tau" in inspect.signature(policy_class(policy).__init__).parameters


def robustness_cells(rob: RobustnessSpec, templates: list[Cell], nominal: Mapping[str, float]) -> list[Cell]:
    """One cell per (template, knob, value): the template is a (workload, cluster, policy, seed)
    cell of the sweep; ``nominal`` maps workloads to their nominal rates."""
    out = []
    for t in templates:
        for knob, values in rob.knobs:
            if knob == "tau" and not takes_tau(t.policy_name):
                continue
            for x in values:
                cluster = dict(t.cluster_config)
                args = dict(t.policy_args)
                if knob == "signal_refresh_s":
                    cluster["signal_refresh_s"] = x
                elif knob == "tau":
                    args["tau"] = x
                elif x != 1.0:
                    before = cluster.get("slowdowns") or []
                    assert isinstance(before, list), before   # ClusterConfig.to_dict's
                    cluster["slowdowns"] = [*before, {"target": rob.slow_target, "at_s": rob.slow_at_s, "factor": x}]
                rate_scale = rob.rate / nominal[t.workload]
                out.append(replace(t, phase="robust", axis=knob, x=x, rate=rob.rate, rate_scale=rate_scale,
                                   cluster_config=cluster, policy_args=args))
    return out
