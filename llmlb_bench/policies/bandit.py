"""An online contextual bandit that learns to route while it routes: LinUCB (Li et al., WWW 2010).

Each decision is one round: the arms are the healthy targets, the context of arm ``i`` is
``x_i = [per-target features of i (policies/features.py), one-hot(i)]``, and the reward comes
back when the request completes (``on_complete`` reads ``req.outcome``, which every backend
sets): ``1 - latency / budget_s`` clipped to 0..1, latency being its TTFT (or E2E), and 0 when it
failed. One ridge regression ``theta`` is shared by every target (the features carry what
targets have in common: a long queue is bad anywhere), and the one-hot part gives each target
its own intercept (what the features miss: a slower GPU, a farther network). The policy picks

    argmax_i  x_i . theta  +  alpha * sqrt(x_i' A^-1 x_i),      A = lambda I + sum x x',

so a target it knows little about gets tried (the bonus), and one that proved slow is avoided.
``A^-1`` is kept by Sherman-Morrison updates (O(d^2) per decision, d = features + targets).

Delayed feedback, the part textbook LinUCB does not face: many requests are in flight at once,
and a slow target's answers come back last. Two choices keep that from trapping the policy:

* rewards are 0..1 with 0 the worst, so the prior (theta = 0) is pessimistic: a target that
  has not answered yet is not assumed perfect (with rewards of minus the latency, an untried
  target looked best and took all traffic until its first, very late answers came back);
* a request counts at dispatch with its predicted reward (A grows, the bonus shrinks), and its
  measured reward replaces the prediction when it completes: the bonus does not stay wide
  while a burst of requests goes to the same target.

Ties (an untrained model) rotate by a seeded random start, so the run is deterministic by seed.

Why short numpy code rather than vowpalwabbit or mabwiser: ``choose`` runs once per request
on the hot path of the simulator and of a live proxy, and the arm set is "whichever targets are
healthy now" with one model shared by all of them, updated out of order by request id; VW's
``cb_explore_adf`` needs its text/example marshalling per call and a native dependency,
mabwiser's LinUCB keeps one model per arm and re-solves on each ``partial_fit``. Twenty lines of
numpy do exactly this, with nothing to install.
"""

from __future__ import annotations

import math
from random import Random
from typing import TYPE_CHECKING, TypeAlias

from llmlb_bench.policies.base import Policy, RouteRequest, View
from llmlb_bench.policies.features import PER_TARGET, Features
from llmlb_bench.lazy_import import lazy_module

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    np = lazy_module("numpy")   # loaded at first use: listing policies needs no numpy (start-up)

#: what the reward measures: the request's time to first token, or its end-to-end latency
REWARDS = ("ttft", "e2e")

Vector: TypeAlias = "npt.NDArray[np.float64]"


class LinUcb(Policy):
    """LinUCB over per-target features plus a per-target intercept; see the module docstring."""

    name = "bandit"
    summary = "Online contextual bandit (LinUCB): learns from each completed request's latency while it routes."
    params = {
        "alpha": (0.2, "exploration: width of the confidence bonus, in reward units (rewards are 0..1)"),
        "reward": ("ttft", f"the latency it minimises: {' or '.join(REWARDS)}"),
        "budget_s": (1.0, "latency budget: reward 1 - latency / budget_s, 0 at or past it or on failure"),
        "ridge": (1.0, "lambda: ridge regularisation (prior precision) of the model"),
        "fields": ("", "comma-separated per-target features (default: all of policies/features.py)"),
        "seed": (0, "seed of the tie-breaking stream"),
    }

    def __init__(self, alpha: float = 0.2, reward: str = "ttft", budget_s: float = 1.0, ridge: float = 1.0,
                 fields: str = "", seed: int = 0) -> None:
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {', '.join(REWARDS)} (got {reward!r})")
        if not (alpha >= 0 and budget_s > 0 and ridge > 0):
            raise ValueError("alpha must be >= 0, and budget_s and ridge > 0")
        names = tuple(f.strip() for f in fields.split(",") if f.strip()) or PER_TARGET
        bad = [f for f in names if f not in PER_TARGET]
        if bad:
            raise ValueError(f"unknown per-target feature {bad[0]!r} (known: {', '.join(PER_TARGET)})")
        self.alpha, self.reward, self.budget_s, self.ridge = alpha, reward, budget_s, ridge
        self.fields = fields
        self.seed = seed
        self._names = names
        self._rng = Random(seed)
        self._features: Features | None = None
        self._a_inv: Vector = np.zeros((0, 0))
        self._b: Vector = np.zeros(0)
        self._theta: Vector = np.zeros(0)
        #: request id -> the context of the target it was sent to, until it completes
        self._pending: dict[int, tuple[Vector, float]] = {}
        #: completions learned from (requests with an outcome)
        self.updates = 0

    def _start(self, view: View) -> Features:
        feats = Features(view, fields=self._names, where="--policy-arg fields")
        d = len(feats.target_names) + len(view)
        self._a_inv = np.eye(d) / self.ridge
        self._b = np.zeros(d)
        self._theta = np.zeros(d)
        self._features = feats
        return feats

    def contexts(self, req: RouteRequest, view: View) -> Vector:
        """``[n_targets, d]``: each target's features followed by its one-hot intercept."""
        feats = self._features or self._start(view)
        t = feats.targets(req, view)
        n, k = t.shape
        x = np.zeros((n, k + n))
        x[:, :k] = t
        x[np.arange(n), k + np.arange(n)] = 1.0
        return x

    def choose(self, req: RouteRequest, view: View) -> int:
        x = self.contexts(req, view)
        ucb = x @ self._theta + self.alpha * np.sqrt(np.einsum("ij,jk,ik->i", x, self._a_inv, x))
        healthy = np.asarray(view.healthy, dtype=bool)
        if healthy.any():
            ucb[~healthy] = -np.inf
        n = len(ucb)
        start = self._rng.randrange(n)
        order = (np.arange(n) + start) % n
        target = int(order[int(np.argmax(ucb[order]))])
        xt = x[target]
        guess = float(xt @ self._theta)
        self._pending[req.request_id] = (xt, guess)
        self.learn(xt, guess)         # until its outcome comes, the request counts as predicted
        assert self._features is not None
        self._features.record(req, target, view.now)
        return target

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        pending = self._pending.pop(req.request_id, None)
        if pending is None or req.outcome is None:
            return
        x, guess = pending
        self._correct(x, self.reward_of(req) - guess)

    def reward_of(self, req: RouteRequest) -> float:
        """``1 - latency / budget_s`` clipped to 0..1 for a completed request (0 when it failed)."""
        o = req.outcome
        assert o is not None
        if o.status != "ok":
            return 0.0
        end = o.first_token_s if self.reward == "ttft" and o.first_token_s is not None else o.end_s
        return max(0.0, 1.0 - (end - req.arrival_s) / self.budget_s)

    def learn(self, x: Vector, reward: float) -> None:
        """One ridge-regression update with context ``x`` and ``reward`` (Sherman-Morrison on A^-1)."""
        if not math.isfinite(reward):
            return
        ax = self._a_inv @ x
        self._a_inv -= np.outer(ax, ax) / (1.0 + x @ ax)
        self._b += reward * x
        self._theta = self._a_inv @ self._b
        self.updates += 1

    def _correct(self, x: Vector, delta: float) -> None:
        """The measured reward replaces the guess ``learn`` counted at dispatch: ``b`` moves by the
        difference, ``A`` stays (it already holds this context)."""
        if math.isfinite(delta):
            self._b += delta * x
            self._theta = self._a_inv @ self._b
