"""The coarse environment: one decision every ``interval_s`` of simulated time, on admission.

Where :class:`~llmlb_bench.learn.env.RouteEnv` asks the agent about every
request, this one asks it at the first arrival at or after each tick
``k x interval_s`` (an interval without arrivals asks nothing) for the
per-target in-flight limit of the next interval, from a fixed ladder
(``limits``; 0 means no limit). In between, requests are routed by a built-in
policy (``policy``, least_outstanding by default) and refused at the router
when every healthy target already has ``limit`` requests of the router's own
in flight, as ``admission_control`` does. The classical baselines are the
control policies (docs/control.md): a fixed limit is ``admission_control``,
moving it on measured TTFT is ``pi_admission``.

Observation (``Box`` float32, ``COARSE_FIELDS`` in this order):

* ``waiting``, ``running``, ``outstanding``: fleet means over healthy targets
  (log1p), ``kv_usage``: their mean (0..1), ``healthy``: the healthy share;
* ``arrivals_per_s``, ``ended_per_s``: over the last interval (log1p);
* ``slo_met_share``: of the requests that ended in the last interval, the share
  that met their SLO (0 when none ended), ``refused_share``: of the last
  interval's arrivals, the share refused;
* ``limit``: log1p of the limit in force (0: none).

Reward: the rewards of :mod:`llmlb_bench.learn.rewards` of every request that
ended during the step (refused requests count as failures), each attributed in
``info["completed"]`` to the decision whose limit admitted (or refused) it;
``info["cost"]`` as in the routing environment.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from llmlb_bench.errors import UserError
from llmlb_bench.learn import register
from llmlb_bench.learn.simenv import Cluster, SimulationEnv, Workload
from llmlb_bench.policies.base import REJECT, Decision, Policy, Released, RouteRequest, View
from llmlb_bench.policies.registry import make_policy
from llmlb_bench.sim.simulation import Simulation

#: the observation's fields, in order (see the module docstring)
COARSE_FIELDS = ("waiting", "running", "outstanding", "kv_usage", "healthy", "arrivals_per_s", "ended_per_s",
                 "slo_met_share", "refused_share", "limit")
#: the default ladder of per-target in-flight limits (0: none)
LIMITS = (1, 2, 4, 8, 16, 32, 64, 128, 0)


class _Gate(Policy):
    """Admission in front of the inner policy; asks the agent at each tick."""

    name = "admission_env"
    summary = "the coarse gymnasium environment's admission gate"

    def __init__(self, env: "AdmissionEnv", inner: Policy) -> None:
        self.env = env
        self.inner = inner

    def choose(self, req: RouteRequest, view: View) -> Decision:
        env = self.env
        env._arrived(req)
        limit = env.limit
        if limit and not any(ok and out < limit for ok, out in zip(view.healthy, view.outstanding_requests)):
            env._refused(req, view.now)
            return REJECT
        return self.inner.choose(req, view)

    def release(self, view: View) -> Released | None:
        return self.inner.release(view)

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        self.env._ended(req)
        self.inner.on_complete(req, target, view)

    def predicted_cached(self, req: RouteRequest, target: int, view: View) -> int | None:
        return self.inner.predicted_cached(req, target, view)


class AdmissionEnv(SimulationEnv[np.ndarray, int]):
    """Admission control every ``interval_s`` over the simulator (see the module docstring)."""

    def __init__(self, workload: Workload = "chat", cluster: Cluster = None, *,
                 slo: str | None = "ttft=500ms,tpot=50ms", reward: str | Mapping[str, float] = "slo_met",
                 split: str = "train", requests: int | None = None, rate_scale: float = 1.0,
                 eval_fraction: float = 0.2, interval_s: float = 5.0, limits: Sequence[int] = LIMITS,
                 policy: str = "least_outstanding", policy_args: Mapping[str, object] | None = None,
                 failure_s: float = 60.0, keep_rows: bool = False) -> None:
        import gymnasium

        super().__init__(workload, cluster, slo=slo, reward=reward, split=split, requests=requests,
                         rate_scale=rate_scale, eval_fraction=eval_fraction, failure_s=failure_s, keep_rows=keep_rows)
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise UserError(f"interval_s must be a positive number of seconds (got {interval_s})", "interval_s")
        if not limits or any(not isinstance(k, int) or k < 0 for k in limits):
            raise UserError("limits must be whole numbers >= 0 (0: no limit)", "limits")
        if self.cluster.disaggregated:
            raise UserError("the admission environment routes with a single-target policy; a disaggregated "
                            "fleet needs the routing environment (RouteEnv)", "cluster")
        self.interval_s = float(interval_s)
        self.limits = tuple(limits)
        self.policy, self.policy_args = policy, dict(policy_args or {})
        make_policy(policy, self.policy_args)     # a bad name or argument: one line, before any episode
        self.observation_space = gymnasium.spaces.Box(0.0, np.inf, (len(COARSE_FIELDS),), np.float32)
        self.action_space = gymnasium.spaces.Discrete(len(self.limits))
        #: the per-target in-flight limit in force (0: none)
        self.limit = 0
        self._next_tick = 0.0
        self._window = [0, 0, 0, 0]      # arrivals, refused, ended, ended meeting the SLO in this interval
        self._last = [0, 0, 0, 0]

    # ---- SimulationEnv's hooks -------------------------------------------------------------------------

    def _proxy(self) -> Policy:
        inner = make_policy(self.policy, self.policy_args, seed=self._episode_seed)
        return _Gate(self, inner)  # type: ignore[abstract]   # no choose_pair: disaggregated fleets are refused

    def _started(self, sim: Simulation) -> None:
        self.limit = 0
        self._next_tick = 0.0
        self._window = [0, 0, 0, 0]
        self._last = [0, 0, 0, 0]

    def _observe(self) -> np.ndarray:
        view = self.view
        healthy = [i for i, ok in enumerate(view.healthy) if ok]
        k = max(len(healthy), 1)
        arrivals, refused, ended, met = self._last
        per_s = 1.0 / self.interval_s
        return np.array([
            math.log1p(sum(view.waiting[i] for i in healthy) / k),
            math.log1p(sum(view.running[i] for i in healthy) / k),
            math.log1p(sum(view.outstanding_requests[i] for i in healthy) / k),
            sum(view.kv_usage[i] for i in healthy) / k,
            len(healthy) / max(len(view.healthy), 1),
            math.log1p(arrivals * per_s), math.log1p(ended * per_s),
            met / ended if ended else 0.0, refused / arrivals if arrivals else 0.0,
            math.log1p(self.limit),
        ], np.float32)

    def _info(self) -> dict[str, Any]:
        return {"decision": self._decisions - 1, "time_s": self._sim.clock() if self._sim is not None else 0.0,
                "limit": self.limit, "completed": self._completed, "cost": self._cost, "invalid": self._invalid}

    def _terminal(self) -> np.ndarray:
        return np.zeros(len(COARSE_FIELDS), np.float32)

    # ---- in the simulation's greenlet -----------------------------------------------------------------

    def _arrived(self, req: RouteRequest) -> None:
        """A request reached the router: at the first one past a tick, the agent sets the next limit."""
        now = self.view.now
        if now >= self._next_tick:
            self._last = self._window
            self._window = [0, 0, 0, 0]
            action = self._yield()
            if 0 <= action < len(self.limits):
                self.limit = self.limits[action]
            else:
                self._invalid = True            # keeps the limit in force
            self._next_tick = (math.floor(now / self.interval_s) + 1) * self.interval_s
        self._window[0] += 1
        self._open[req.request_id] = [self._decisions - 1]

    def _refused(self, req: RouteRequest, now: float, status: str = "rejected") -> None:
        self._window[1] += 1
        super()._refused(req, now, status)

    def _ended(self, req: RouteRequest) -> None:
        before = self._cost["slo_violation"]
        super()._ended(req)
        self._window[2] += 1
        if self._cost["slo_violation"] == before:      # rewards.py counts a violation for every miss
            self._window[3] += 1

register()
