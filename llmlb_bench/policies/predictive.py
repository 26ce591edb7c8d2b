"""Routing by predicted output length.

JSQ counts requests and least-tokens counts *requested* tokens; neither knows
that one request will stop after 20 tokens and another run to 2,000. A
length predictor lets the router balance the decode work actually coming.
The predictor is :class:`~llmlb_bench.policies.oracle.KendallOracle` with
quality ``tau``, so a sweep over tau shows how good a predictor must be
before it beats plain JSQ. The oracle reads the request's requested output
length as the truth: in a trace replay (and in the simulator) a request
generates exactly its ``output_tokens``. With ``predictor=FILE`` a trained
predictor (``llmlb learn predictor``; :mod:`llmlb_bench.policies.predictor`)
replaces the oracle and reads only what is known at arrival.
"""

from __future__ import annotations

from llmlb_bench.policies.base import Policy, RouteRequest, View
from llmlb_bench.policies.predictor import OutputLengths
from llmlb_bench.policies.select import argmin_healthy


class LeastPredictedWork(Policy):
    name = "least_predicted_work"
    summary = "Least outstanding predicted work: predicted output tokens (+ input_weight x prompt), oracle or trained."
    params = {
        "tau": (0.5, "Kendall tau of the length predictor against the true output length (1 = perfect, 0 = useless)"),
        "input_weight": (0.0, "weight of prompt tokens in a request's work, relative to one output token"),
        "seed": (0, "seed of the predictor's noise"),
        "predictor": ("", "trained predictor file (llmlb learn predictor); replaces the tau oracle"),
    }

    def __init__(self, tau: float = 0.5, input_weight: float = 0.0, seed: int = 0, predictor: str = "") -> None:
        if input_weight < 0:
            raise ValueError(f"input_weight must be >= 0 (got {input_weight})")
        self.tau, self.input_weight, self.seed, self.predictor = tau, input_weight, seed, predictor
        self.lengths = OutputLengths(tau, seed, predictor)
        self._work: list[float] = []
        self._pending: dict[int, float] = {}
        self._tie = 0

    def choose(self, req: RouteRequest, view: View) -> int:
        n = len(view)
        if len(self._work) < n:
            self._work.extend([0.0] * (n - len(self._work)))
        work = self.lengths.predict(req, req.max_output_tokens) + self.input_weight * req.input_tokens
        self._tie += 1
        target = argmin_healthy(self._work, view, self._tie)
        self._work[target] += work
        self._pending[req.request_id] = work
        return target

    def on_complete(self, req: RouteRequest, target: int, view: View) -> None:
        self._work[target] -= self._pending.pop(req.request_id, 0.0)
