"""Speculative decoding in a simulated replica: a proposer drafts, the target verifies.

At every step a proposer drafts ``k`` tokens for each decoding sequence; the
target model scores all ``k + 1`` positions of every sequence in its own step
(the verify pass) and the sequence keeps the drafted tokens up to the first
rejection plus one token of the target's own (the correction, or the bonus
token when all ``k`` were accepted). Under the standard i.i.d. model
(Leviathan et al., "Fast Inference from Transformers via Speculative
Decoding", ICML 2023) each draft token is accepted with probability ``a``
independently, so the accepted count is ``min(G, k)`` with ``G`` geometric
(``P(G = j) = a^j (1 - a)``) and a step emits on average

    E[tokens per step] = (1 - a^(k+1)) / (1 - a)

tokens. At batch 1, with the proposer costing ``c`` target steps per draft
token and the verify step costing ``v`` target steps, the speed-up over
plain decoding is E / (v + k c) (Leviathan et al.'s (1 - a^(k+1)) /
((1 - a)(k c + 1)) with v = 1).

Proposers (``method``, vLLM's names):

* ``draft_model``: a smaller model runs ``k`` sequential decode steps over
  the batch: its own roofline cost from the catalog (``draft_model``), or
  ``cost_ratio`` target decode steps per draft step.
* ``eagle``: a light head on the target's hidden states, ``k`` sequential
  steps of ``cost_ratio`` target decode steps each (default one layer's
  share, 1 / layers: EAGLE's head is one decoder layer).
* ``ngram``: prompt lookup on the CPU, no GPU time.

Where it sits in the replica (:mod:`llmlb_bench.sim.replica`, which keeps
its one-slot-per-step run planning): a decoding request advances one *step*
at a time, its finish is the step at which its drawn tokens reach its
output length, and the tokens it has made are read from the draws when it
leaves decode (finish, preemption, hand-over). The draws are made when the
request starts decoding, from a generator seeded by (run seed, request id,
decode stint), so a run is deterministic under its seed. What is
approximated: the KV cache and the attention context of a decoding
sequence grow by one slot per step inside a decode stint (the extra
accepted tokens are counted in when it leaves decode: a recompute or a
swap carries them); the draft model's own weights and KV are not taken
from the target's memory. The verify step is the target's step with
``k + 1`` query tokens per decoding sequence, attending to its context, and
the LM head on each of them; the proposer's time is added to the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

import numpy as np
import pyarrow as pa

from llmlb_bench.errors import UserError
from llmlb_bench.sim.timeline import Columns, step_end_times
from llmlb_bench.tomlfile import as_table, check_fields, construct

METHODS = ("draft_model", "eagle", "ngram")
#: trace columns that can name a request's acceptance class
CLASS_COLUMNS = ("kind", "slo_class")


class StepModel(Protocol):
    """What a cost model (roofline or measured profile) offers the proposer."""

    def run_step(self, tokens: int, attn: float, kv: float, sampled: int) -> tuple[float, float]: ...


def expected_tokens(a: float, k: int) -> float:
    """Mean tokens one verify step emits per sequence at acceptance rate ``a`` with ``k`` drafts."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class SpeculativeSpec:
    """A pool's ``speculative`` settings, checked (see the module docstring)."""

    method: str = "ngram"
    #: draft tokens per sequence per step (vLLM's ``num_speculative_tokens``)
    num_speculative_tokens: int = 4
    #: acceptance rate of each draft token for requests of no listed class
    acceptance: float = 0.7
    #: the trace column whose value picks a request's acceptance rate from ``classes``
    acceptance_by: str = "kind"
    #: acceptance rate per value of ``acceptance_by`` (e.g. {"code": 0.85, "chat": 0.6})
    classes: Mapping[str, float] = field(default_factory=dict)
    #: draft_model: the catalog model that drafts (else ``cost_ratio``)
    draft_model: str | None = None
    #: draft_model / eagle: cost of one draft step in target decode steps (eagle default: 1 / layers)
    cost_ratio: float | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, object], where: str) -> "SpeculativeSpec":
        check_fields(raw, cls.__dataclass_fields__, where)
        # each value checked below
        spec = construct(cls, {**raw, "classes": dict(as_table(raw.get("classes", {}), f"{where}.classes"))})
        if spec.method not in METHODS:
            raise UserError(f"must be one of {', '.join(METHODS)}, got {spec.method!r}", f"{where}.method")
        k = spec.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise UserError(f"must be a positive integer, got {k!r}", f"{where}.num_speculative_tokens")
        if spec.acceptance_by not in CLASS_COLUMNS:
            raise UserError(f"must be one of {', '.join(CLASS_COLUMNS)}, got {spec.acceptance_by!r}",
                            f"{where}.acceptance_by")
        for name, a in [("acceptance", spec.acceptance), *((f"classes.{c}", v) for c, v in spec.classes.items())]:
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= 1:
                raise UserError(f"must be an acceptance rate in [0, 1], got {a!r}", f"{where}.{name}")
        r = spec.cost_ratio
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or r < 0):
            raise UserError(f"must be a number >= 0, got {r!r}", f"{where}.cost_ratio")
        if spec.method == "draft_model" and (spec.draft_model is None) == (r is None):
            raise UserError("method draft_model needs exactly one of draft_model (a catalog model) and cost_ratio",
                            where)
        if spec.method != "draft_model" and spec.draft_model is not None:
            raise UserError(f"draft_model applies to method draft_model, not {spec.method}", f"{where}.draft_model")
        if spec.method == "ngram" and r is not None:
            raise UserError("an n-gram proposer has no GPU cost (cost_ratio applies to draft_model and eagle)",
                            f"{where}.cost_ratio")
        return spec


class Speculation:
    """One pool's proposer and acceptance draws, shared by its replicas.

    ``rates`` gives each trace row its acceptance rate (None: every request
    the default, as in the live server, whose requests are not trace rows).
    """

    def __init__(self, spec: SpeculativeSpec, target: StepModel, draft: StepModel | None, target_layers: int,
                 rates: np.ndarray | None, seed: int) -> None:
        self.spec = spec
        self.k = spec.num_speculative_tokens
        self.target = target
        self.draft = draft
        ratio = spec.cost_ratio
        self.ratio = 0.0 if spec.method == "ngram" or draft is not None else (
            ratio if ratio is not None else 1.0 / target_layers)
        self.rates = rates
        self.seed = seed

    @staticmethod
    def class_rates(spec: SpeculativeSpec, trace: pa.Table) -> np.ndarray:
        """Each trace row's acceptance rate, by its ``acceptance_by`` column."""
        if not spec.classes or spec.acceptance_by not in trace.column_names:
            return np.full(trace.num_rows, float(spec.acceptance))
        values: Sequence[str | None] = trace.column(spec.acceptance_by).cast(pa.string()).to_pylist()
        return np.array([spec.classes.get(v, spec.acceptance) if v is not None else spec.acceptance
                         for v in values], dtype=np.float64)

    def step(self, tokens: int, attn: float, kv: float, sampled: int, decoding: int,
             context: float) -> tuple[float, float]:
        """(time, power) of a step with prefill chunks (``tokens``, ``attn``, ``kv``, ``sampled``:
        their part, as the replica counts it) and ``decoding`` sequences of ``context`` total
        context, each verifying ``k`` drafts: k + 1 query tokens attending to its context (and
        to the earlier drafts), the LM head on each; then the proposer's ``k`` sequential steps."""
        k1 = self.k + 1
        gap, power = self.target.run_step(tokens + decoding * k1,
                                          attn + k1 * context + decoding * self.k * k1 / 2,
                                          kv + context + decoding * self.k, sampled + decoding * self.k)
        if not decoding or (self.draft is None and not self.ratio):
            return gap, power
        source = self.draft if self.draft is not None else self.target
        d_gap, d_power = source.run_step(decoding, context, context, decoding)
        if self.draft is None:
            d_gap *= self.ratio
        d_gap *= self.k
        total = gap + d_gap
        return total, (power * gap + d_power * d_gap) / total

    def draw(self, row: int, request_id: int, stint: int, remaining: int) -> tuple[np.ndarray, np.ndarray]:
        """The accepted drafts and the tokens emitted at each step of a decode stint of request
        ``request_id`` (trace row ``row``) that must make ``remaining`` tokens: (accepted,
        emitted), as long as the steps it takes (the last step's emission is cut at the output
        length, as max_tokens cuts it). Seeded by the request id, so a request draws the same in
        a batch simulation and in ``llmlb serve``, whatever its row."""
        a = float(self.rates[row]) if self.rates is not None else float(self.spec.acceptance)
        k = self.k
        rng = np.random.default_rng((self.seed, request_id, stint))
        # at least one token per step: ``remaining`` draws always suffice
        n = min(remaining, math.ceil(remaining / expected_tokens(a, k) * 1.5) + 16)
        while True:
            acc = (np.full(n, k, dtype=np.int64) if a >= 1.0 else
                   np.minimum(rng.geometric(1.0 - a, n) - 1, k) if a > 0 else np.zeros(n, dtype=np.int64))
            emitted = np.cumsum(acc + 1)
            steps = int(np.searchsorted(emitted, remaining)) + 1
            if steps <= n:
                break
            n = remaining
        acc = acc[:steps]
        out = acc + 1
        out[-1] -= int(emitted[steps - 1]) - remaining
        return acc, out


class Stint:
    """A request's decode steps under speculation: where they start and what each one drew."""

    __slots__ = ("start", "accepted", "emitted")

    def __init__(self, start: int, accepted: np.ndarray, emitted: np.ndarray) -> None:
        self.start = start
        self.accepted = accepted
        self.emitted = emitted

    @property
    def steps(self) -> int:
        return len(self.emitted)

    def cut(self, steps: int) -> int:
        """The stint ends after ``steps`` of its steps: keep those; returns the tokens they made."""
        self.accepted = self.accepted[:steps]
        self.emitted = self.emitted[:steps]
        return int(self.emitted.sum())


def step_tokens(stints: Sequence[Stint], a: int, b: int) -> np.ndarray:
    """Tokens emitted at each step ``a..b`` of a request's span: its stints' draws, one token at a
    step no stint covers (the step that finished its prefill)."""
    out = np.ones(b - a + 1, dtype=np.int64)
    for st in stints:
        lo, hi = max(a, st.start), min(b, st.start + st.steps - 1)
        if lo <= hi:
            out[lo - a:hi - a + 1] = st.emitted[lo - st.start:hi - st.start + 1]
    return out


def bundled_steps(tl: Columns, stints: Sequence[Stint], spans: Sequence[tuple[int, int]]) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """A request's tokens under speculation, one delivery per step of its ``spans`` on timeline
    ``tl``: (each step's end time, the tokens it emitted)."""
    steps = [np.arange(a, b + 1) for a, b in spans]
    return (np.concatenate([step_end_times(tl, s) for s in steps]),
            np.concatenate([step_tokens(stints, a, b) for a, b in spans]))
