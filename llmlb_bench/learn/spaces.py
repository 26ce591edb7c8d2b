"""The routing environment's observation and action spaces (gymnasium), and their fixed layout.

Observation (a ``gymnasium.spaces.Dict``; wrap it in ``gymnasium.wrappers.FlattenObservation``
for learners that want one vector):

* ``targets``: float32 ``[max_targets, len(target_names)]``, the per-target fields of
  :mod:`llmlb_bench.policies.features` for this request, one row per target; rows past the
  fleet's current size are zeros.
* ``request``: float32 ``[len(request_names)]``, the request's fields.
* ``router``: float32 ``[2]``, only when HOLD is an action: ``log1p`` of the requests
  the router holds now, and the seconds this request has waited at the router (0 for a
  new arrival).
* ``action_mask``: int8 ``[n_actions]``, 1 where the action is valid now: a healthy target
  that exists; HOLD and REJECT when they are actions.

Action (``Discrete(n_actions)``): ``0 .. max_targets-1`` send the request to that target;
then ``HOLD`` (when enabled) and ``REJECT`` (when enabled) in this order. A target index the
fleet does not have now is refused as REJECT (``info["invalid"]``); an unhealthy target is
accepted and the request fails there, as it would in front of a real fleet.

On a disaggregated fleet (prefill and decode pools) the action is a pair,
``MultiDiscrete([max_targets (+1 REJECT), max_targets])``: the prefill target (or REJECT) and
the decode target; ``action_mask`` is then the two components' masks one after the other (a
healthy prefill replica, REJECT; a healthy decode replica), which is how the agent tells the
pools apart. HOLD is not an action there (the router's pair decision has no queue).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from llmlb_bench.policies.base import HOLD, REJECT, Decision, PairDecision

if TYPE_CHECKING:     # gymnasium loads with the environment, not with this module
    from gymnasium import spaces as gs


@dataclass(frozen=True)
class Actions:
    """The discrete actions: targets first, then HOLD and REJECT where enabled."""

    max_targets: int
    hold: bool
    reject: bool
    #: a (prefill, decode) pair per decision (a disaggregated fleet)
    pair: bool = False

    @property
    def n(self) -> int:
        """Entries of the action mask."""
        return self.max_targets + self.hold + self.reject + (self.max_targets if self.pair else 0)

    @property
    def hold_index(self) -> int:
        """The HOLD action (-1: not an action)."""
        return self.max_targets if self.hold else -1

    @property
    def reject_index(self) -> int:
        """The REJECT action (-1: not an action)."""
        return self.max_targets + self.hold if self.reject else -1

    def of(self, decision: Decision) -> int:
        """The action that makes the environment take ``decision`` (a policy's answer)."""
        if decision is HOLD:
            if not self.hold:
                raise ValueError("HOLD is not an action of this environment (hold=True enables it)")
            return self.hold_index
        if decision is REJECT:
            if not self.reject:
                raise ValueError("REJECT is not an action of this environment (reject=True enables it)")
            return self.reject_index
        assert isinstance(decision, int)
        return decision

    def of_pair(self, decision: PairDecision) -> list[int]:
        """The action that makes the environment take a ``choose_pair`` answer."""
        if decision is REJECT:
            if not self.reject:
                raise ValueError("REJECT is not an action of this environment (reject=True enables it)")
            return [self.reject_index, 0]
        return [decision[0], decision[1]]

    def names(self) -> list[str]:
        """The action mask's entries."""
        first = [f"target {i}" for i in range(self.max_targets)] + ["HOLD"] * self.hold + ["REJECT"] * self.reject
        if self.pair:
            return [f"prefill {n}" for n in first[:self.max_targets]] + first[self.max_targets:] + [
                f"decode target {i}" for i in range(self.max_targets)]
        return first


def spaces(actions: Actions, n_target_fields: int, n_request_fields: int
           ) -> tuple[gs.Dict, gs.Discrete[np.int64] | gs.MultiDiscrete]:
    """(observation space, action space)."""
    from gymnasium import spaces as gs

    obs: dict[str, gs.Space[Any]] = {      # gymnasium's Dict takes its spaces whatever they hold
        "targets": gs.Box(-np.inf, np.inf, (actions.max_targets, n_target_fields), np.float32),
        "request": gs.Box(-np.inf, np.inf, (n_request_fields,), np.float32),
    }
    if actions.hold:
        obs["router"] = gs.Box(0.0, np.inf, (2,), np.float32)
    obs["action_mask"] = gs.Box(0, 1, (actions.n,), np.int8)
    if actions.pair:
        return gs.Dict(obs), gs.MultiDiscrete([actions.max_targets + actions.reject, actions.max_targets])
    return gs.Dict(obs), gs.Discrete(actions.n)


def empty_observation(actions: Actions, n_target_fields: int, n_request_fields: int) -> dict[str, np.ndarray]:
    """The observation after the last step (nothing left to decide): zeros, nothing valid."""
    obs = {"targets": np.zeros((actions.max_targets, n_target_fields), np.float32),
           "request": np.zeros(n_request_fields, np.float32)}
    if actions.hold:
        obs["router"] = np.zeros(2, np.float32)
    obs["action_mask"] = np.zeros(actions.n, np.int8)
    return obs


def layout(actions: Actions, target_names: tuple[str, ...], request_names: tuple[str, ...]) -> dict[str, object]:
    """The observation's named layout (stored beside a trained policy, printed by the docs)."""
    return {"targets": {"rows": actions.max_targets, "columns": list(target_names)},
            "request": list(request_names),
            **({"router": ["held_log1p", "waited_s"]} if actions.hold else {}),
            "action_mask": actions.names(),
            "actions": ([actions.names()[:actions.max_targets + actions.reject],
                         actions.names()[actions.max_targets + actions.reject:]] if actions.pair
                        else actions.names())}
