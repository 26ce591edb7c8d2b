"""The routing environment: one ``gymnasium`` step per routing decision of the simulator.

The environment drives the *same* :class:`~llmlb_bench.sim.simulation.Simulation`
as ``llmlb simulate``; nothing is simulated twice. The simulation runs in a
greenlet (a C-level coroutine; :mod:`llmlb_bench.learn.simenv`, shared with the
coarse :mod:`llmlb_bench.learn.admission` environment) whose policy is a proxy: when the simulator's
:class:`~llmlb_bench.policies.Router` asks the proxy's ``choose``, the proxy
switches to the caller of :meth:`RouteEnv.step` with the request (the
observation is built from the simulator's own :class:`View` at that instant),
and returns the action it gets back when ``step`` switches in again. So the
event loop keeps its shape, and a policy acting through the environment sees
exactly the View a built-in policy sees in ``llmlb simulate``
(:class:`PolicyAgent` shows it: its rows are those of ``llmlb simulate``).

Spaces: :mod:`llmlb_bench.learn.spaces`; features: :mod:`llmlb_bench.policies.features`;
rewards and costs: :mod:`llmlb_bench.learn.rewards`; episodes and the train/eval
split: :mod:`llmlb_bench.learn.episodes`.

``step`` returns, besides the reward (the weighted reward of every request that
ended during the step, plus at the last step the episode terms and the
failure of requests still held):

* ``info["completed"]``: ``[(decision id, reward), ...]`` of requests that ended
  during the step; a request's reward is attributed to every decision taken
  about it (a HOLD, then the release that sent it);
* ``info["cost"]``: the constraint costs of those requests (rewards.COSTS);
* ``info["decision"]``, ``info["request_id"]``, ``info["release"]``,
  ``info["time_s"]``: the decision the new observation asks for (``release``:
  it is about a request the router holds, offered again at a release
  opportunity, oldest first);
* at the last step, ``info["episode"]``: the episode terms and status counts.

On a disaggregated fleet (prefill and decode pools) each action is a (prefill, decode) pair
(learn/spaces.py).
"""

from __future__ import annotations

from collections import deque
from itertools import chain
from typing import Any, Mapping, Sequence, TypedDict

import numpy as np

from llmlb_bench.errors import UserError
from llmlb_bench.learn import register
from llmlb_bench.learn.simenv import Cluster, SimulationEnv, Workload
from llmlb_bench.learn.spaces import Actions, empty_observation, layout, spaces
from llmlb_bench.policies.base import HOLD, REJECT, Decision, PairDecision, Policy, Released, RouteRequest, View
from llmlb_bench.policies.features import Features, LengthPredictor
from llmlb_bench.sim.simulation import Simulation


class _Proxy(Policy):
    """The simulation's policy: every question goes to the environment (see the module docstring)."""

    name = "env"
    summary = "the gymnasium environment's agent"

    def __init__(self, env: "RouteEnv") -> None:
        self.env = env
        if env.watched is not None:     # the rows name the policy that decided (a router refusal's text)
            self.name = env.watched.name  # type: ignore[misc]

    def choose(self, req: RouteRequest, view: View) -> Decision:
        return self.env._decide(req, False)

    def choose_pair(self, req: RouteRequest, view: View) -> PairDecision:
        return self.env._decide_pair(req)

    def release(self, view: View) -> Released | None:
        return self.env._release()

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        env = self.env
        env._ended(req)
        if env.watched is not None:
            env.watched.on_complete(req, target, view)

    def predicted_cached(self, req: RouteRequest, target: int, view: View) -> int | None:
        watched = self.env.watched
        return watched.predicted_cached(req, target, view) if watched is not None else None


class _FeatureArgs(TypedDict):
    """How the environment's :class:`Features` are built, at construction and for each episode's view."""

    fields: Sequence[str] | None
    predictor: LengthPredictor | None
    slo_classes: Sequence[str]
    kinds: Sequence[str]
    prefix_source: str


class RouteEnv(SimulationEnv[dict[str, np.ndarray], Any]):
    """Per-request routing over the simulator (see the module docstring and docs/learning.md).

    ``workload``: a preset name, a workload spec or trace path, a :class:`WorkloadSpec` or a trace
    table; ``cluster``: a :class:`ClusterConfig`, a ``--cluster`` TOML path, or a mapping of its
    fields (default: the simulator's default fleet); ``slo`` in the ``--slo`` syntax; ``reward``:
    rewards.py's terms with weights; ``split``: ``"train"`` or ``"eval"``; ``requests``: requests per
    episode; ``hold`` / ``reject``: HOLD / REJECT as actions; ``max_targets``: rows of the target
    matrix (default: the fleet's initial size); ``fields`` / ``predictor`` / ``slo_classes`` / ``kinds`` /
    ``prefix_source``: the features (policies/features.py); ``keep_rows``: keep the simulator's requests rows
    (:meth:`requests_table`).
    """

    def __init__(self, workload: Workload = "chat", cluster: Cluster = None, *,
                 slo: str | None = "ttft=500ms,tpot=50ms", reward: str | Mapping[str, float] = "slo_met",
                 split: str = "train", requests: int | None = None, rate_scale: float = 1.0,
                 eval_fraction: float = 0.2, hold: bool = False, reject: bool = False,
                 max_targets: int | None = None, fields: Sequence[str] | None = None,
                 predictor: LengthPredictor | None = None, slo_classes: Sequence[str] = (), kinds: Sequence[str] = (),
                 prefix_source: str = "auto",
                 failure_s: float = 60.0, keep_rows: bool = False) -> None:
        super().__init__(workload, cluster, slo=slo, reward=reward, split=split, requests=requests,
                         rate_scale=rate_scale, eval_fraction=eval_fraction, failure_s=failure_s, keep_rows=keep_rows)
        if self.cluster.disaggregated and hold:
            raise UserError("HOLD is not an action on a disaggregated fleet (its pair decision has no router "
                            "queue); leave hold off", "hold")
        n = max_targets if max_targets is not None else self.cluster.replicas
        if n < 1:
            raise UserError(f"max_targets must be >= 1 (got {n})", "max_targets")
        self.actions = Actions(n, hold, reject, pair=self.cluster.disaggregated)
        #: the action mask past the fleet's targets: padding rows (0), then HOLD and REJECT (1)
        self._mask_tail = [False] * n + [True] * (hold + reject)
        self._feature_args: _FeatureArgs = {"fields": fields, "predictor": predictor, "slo_classes": slo_classes,
                                            "kinds": kinds, "prefix_source": prefix_source}
        probe = Features(None, **self._feature_args)
        self.target_names, self.request_names = probe.target_names, probe.request_names
        self.feature_layout = probe.layout()
        self.observation_space, self.action_space = spaces(self.actions, len(self.target_names),
                                                           len(self.request_names))
        #: a policy told of completions and asked for cache predictions, as the Router would (PolicyAgent)
        self.watched: Policy | None = None
        self._features = probe
        self._queue: deque[RouteRequest] = deque()
        #: the request the current observation asks about, and whether it is a held one offered again
        self.request: RouteRequest | None = None
        self.releasing = False

    def observation_layout(self) -> dict[str, object]:
        """Every observation field by name (spaces.layout) and the feature layout (features.layout)."""
        return {**layout(self.actions, self.target_names, self.request_names), "features": self.feature_layout}

    # ---- SimulationEnv's hooks -------------------------------------------------------------------------

    def _proxy(self) -> Policy:
        return _Proxy(self)

    def _started(self, sim: Simulation) -> None:
        self._features = Features(sim.view, **self._feature_args)
        self._queue.clear()

    def _action(self, action: Any) -> Any:
        return (int(action[0]), int(action[1])) if self.actions.pair else int(action)

    def _terminal(self) -> dict[str, np.ndarray]:
        self.request = None
        return empty_observation(self.actions, len(self.target_names), len(self.request_names))

    def _leftovers(self, end_s: float) -> None:
        """Requests still held when the trace was over were never sent."""
        for req in self._queue:
            self._refused(req, end_s, "not_sent")
        self._queue.clear()

    # ---- decisions (in the simulation's greenlet) -----------------------------------------------------

    def _ask(self, req: RouteRequest, releasing: bool) -> Any:
        """Hand ``req`` to the agent; its answer when ``step`` resumes us."""
        ids = self._open.setdefault(req.request_id, [])
        ids.append(self._decisions)
        self.request, self.releasing = req, releasing
        return self._yield()

    def _decide(self, req: RouteRequest, releasing: bool) -> Decision:
        """Ask the agent about ``req`` and act on its answer."""
        action: int = self._ask(req, releasing)
        sim = self._sim
        assert sim is not None
        view = sim.view
        acts = self.actions
        if 0 <= action < len(view.targets) and action < acts.max_targets:
            self._features.record(req, action, view.now)
            return action
        if acts.hold and action == acts.hold_index:
            if not releasing:
                self._queue.append(req)
            return HOLD
        if not (acts.reject and action == acts.reject_index):
            self._invalid = True
        self._refused(req, sim.clock())
        return REJECT

    def _decide_pair(self, req: RouteRequest) -> PairDecision:
        """Ask the agent for a (prefill, decode) pair for ``req`` (a disaggregated fleet)."""
        p, d = self._ask(req, False)
        sim = self._sim
        assert sim is not None
        n = min(len(sim.view.targets), self.actions.max_targets)
        if 0 <= p < n and 0 <= d < n:
            self._features.record(req, p, sim.view.now)
            return p, d
        if not (self.actions.reject and p == self.actions.reject_index):
            self._invalid = True
        self._refused(req, sim.clock())
        return REJECT

    def _release(self) -> Released | None:
        """A release opportunity: the oldest held request is offered to the agent again."""
        if not self._queue:
            return None
        head = self._queue[0]
        d = self._decide(head, True)
        if d is HOLD:
            return None
        self._queue.popleft()
        return head, REJECT if d is REJECT else d

    # ---- observations ---------------------------------------------------------------------------------

    def _observe(self) -> dict[str, np.ndarray]:
        req = self.request
        assert req is not None and self._sim is not None
        view = self._sim.view
        acts = self.actions
        n = len(view.targets)
        if n > acts.max_targets:
            raise UserError(f"the fleet grew to {n} targets, more than the environment's max_targets="
                            f"{acts.max_targets}; pass a larger max_targets", "max_targets")
        feats = self._features
        # one float32 buffer for the target matrix (field-major, padded) and the request vector
        cols = feats.target_columns(req, view)
        values = feats.request_values(req)
        k, m = len(cols), acts.max_targets
        pad = m - n
        if pad:
            zeros = [0.0] * pad
            cols = [part for col in cols for part in (col, zeros)]
        buf = np.fromiter(chain(chain.from_iterable(cols), values), np.float32, k * m + len(values))
        targets = buf[:k * m].reshape(k, m).T
        if acts.pair:
            mask = self._pair_mask(view.healthy, pad)
        else:
            mask = np.array([*view.healthy, *self._mask_tail[len(self._mask_tail) - pad - acts.hold - acts.reject:]],
                            np.int8)
        obs: dict[str, np.ndarray] = {"targets": targets, "request": buf[k * m:]}
        if acts.hold:
            waited = self._sim.clock() - req.arrival_s if self.releasing else 0.0
            obs["router"] = np.array([np.log1p(len(self._queue)), waited], np.float32)
        obs["action_mask"] = mask
        return obs

    def _pair_mask(self, healthy: Sequence[bool], pad: int) -> np.ndarray:
        """A healthy prefill replica, padding, REJECT; then a healthy decode replica, padding."""
        assert self._sim is not None
        roles = [rep.role for rep in self._sim.replicas]
        zeros = [False] * pad
        first = [ok and role == "prefill" for ok, role in zip(healthy, roles)] + zeros + [True] * self.actions.reject
        return np.array(first + [ok and role == "decode" for ok, role in zip(healthy, roles)] + zeros, np.int8)

    def _info(self) -> dict[str, Any]:
        req = self.request
        assert req is not None
        return {"decision": self._decisions - 1, "request_id": req.request_id, "release": self.releasing,
                "time_s": self._sim.clock() if self._sim is not None else 0.0, "completed": self._completed,
                "cost": self._cost, "invalid": self._invalid}


class PolicyAgent:
    """A built-in (or any) policy acting through the environment: it answers each observation with
    what the policy's ``choose`` (or, for a held request, ``release``) says on the simulator's View.
    Its runs are those of ``llmlb simulate`` with that policy (tests/test_env.py)."""

    def __init__(self, env: RouteEnv, policy: Policy) -> None:
        self.env = env
        self.policy = policy
        env.watched = policy

    def act(self) -> int | list[int]:
        env = self.env
        req = env.request
        assert req is not None
        if env.actions.pair:
            return env.actions.of_pair(self.policy.choose_pair(req, env.view))
        if not env.releasing:
            return env.actions.of(self.policy.choose(req, env.view))
        got = self.policy.release(env.view)
        if got is None:
            return env.actions.hold_index
        held, target = got
        if held.request_id != req.request_id:
            raise ValueError(f"policy {self.policy.name!r} released request {held.request_id}; the environment "
                             f"offers its held requests oldest first ({req.request_id} now)")
        return env.actions.of(target)


register()
