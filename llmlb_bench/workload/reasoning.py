"""How much of each request's output is reasoning (chain of thought before the answer).

Convention, the same everywhere in llmlb: ``output_tokens`` = reasoning + answer.
A reasoning model generates its thinking as ordinary decode steps, so the
engine's work is the whole ``output_tokens``; ``reasoning_tokens`` says how
many of them come first, before the first answer token (token number
``reasoning_tokens + 1``).

A tenant's ``[reasoning]`` table gives it one of two ways:

* ``ratio``: the reasoning share of the output as a distribution on [0, 1]
  (ServeGen's ``reason_ratio``, measured on DeepSeek-R1 traffic); ``output``
  is then the whole generation, and reasoning = round(ratio x output);
* ``tokens``: the reasoning length as a token distribution; ``output`` is
  then the answer, and each request's ``output_tokens`` = answer + reasoning.

``probability`` (default 1) is the share of requests that reason at all (a
hybrid model asked to think only sometimes); the others have none. Draws come
from the tenant's own reasoning stream, so adding reasoning to a tenant
changes nothing else in the trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmlb_bench.workload.distributions import Distribution, Lengths, parse_distribution, parse_lengths
from llmlb_bench.workload.fields import Section

#: The request field that tells an engine how many of a request's output tokens to make reasoning:
#: ``vllm_xargs.reasoning_tokens`` (vLLM's per-request arguments of custom logits processors). The
#: replayer sends it for trace rows with reasoning; ``llmlb serve`` and the think-tag logits
#: processor for vLLM (:mod:`llmlb_bench.engines.think_tags`) read it. docs/replay.md.
REASONING_ARG = "reasoning_tokens"


@dataclass(frozen=True)
class Reasoning:
    """A tenant's reasoning: a share of the output (``ratio``) or a length of its own (``tokens``)."""

    ratio: Distribution | None
    tokens: Lengths | None
    probability: float = 1.0

    def draw(self, rng: np.random.Generator, output: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(output_tokens, reasoning_tokens)`` for requests whose drawn ``output`` is given."""
        n = len(output)
        thinks = rng.random(n) < self.probability if self.probability < 1.0 else np.ones(n, bool)
        if self.ratio is not None:
            share = np.clip(self.ratio.sample(rng, n), 0.0, 1.0)
            reasoning = np.where(thinks, np.rint(share * output), 0).astype(np.int64)
            # a share below 1 leaves an answer, however short the output rounds it
            return output, np.minimum(reasoning, np.where(share < 1.0, np.maximum(output - 1, 0), output))
        assert self.tokens is not None
        reasoning = np.where(thinks, self.tokens.sample(rng, n), 0).astype(np.int64)
        return output + reasoning, reasoning


def parse_reasoning(s: Section) -> Reasoning:
    has_ratio, has_tokens = s.has("ratio"), s.has("tokens")
    if has_ratio == has_tokens:
        raise s.error("ratio" if not has_ratio else "tokens",
                      "give exactly one of ratio (share of the output) or tokens (a reasoning length)")
    ratio = tokens = None
    if has_ratio:
        sub = s.section("ratio")
        assert sub is not None
        ratio = parse_distribution(sub)
        # a share of the output lies in [0, 1]: mass above 1 is a mistake (a percentage, a length),
        # which clipping in draw() would silently turn into all-reasoning outputs
        above = 1.0 - float(ratio.cdf(np.array([1.0]))[0])
        if above > 1e-9:
            raise s.error("ratio", f"the reasoning share of the output must lie in [0, 1]; this "
                                   f"distribution puts {above:.0%} of its mass above 1")
    else:
        sub = s.section("tokens")
        assert sub is not None
        tokens = parse_lengths(sub, default_min=0)
    out = Reasoning(ratio=ratio, tokens=tokens, probability=s.number("probability", 1.0, ge=0, le=1))
    s.finish()
    return out
