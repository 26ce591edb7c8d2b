"""Multi-turn sessions and shared system prompts.

A session is a conversation: turn k's prompt is the system prompt, every
earlier user message and reply, then the new user message, so context grows
turn by turn and each turn's prompt extends the previous turn's prompt plus
its reply (which is exactly what a prefix cache can reuse). Turn k+1 is sent
a think time after turn k *completes*: it is a dependent request
(``parent_id`` = turn k, ``after_parent_s`` = think time) and its
``arrival_s`` is only the earliest possible time.

An agent's session (``tools``) also has tool turns: the model's call asks
for a tool, the tool runs ``tool_s`` seconds, and the next call carries the
tool's result (``tokens``) instead of a user's message; its
``after_parent_s`` is the tool's time, not a human's think time. Context
grows and shares its prefix across tool turns exactly as across human turns.

System prompts come from a pool of ``groups`` prompts whose popularity is
Zipf(``popularity``) over the groups; tenants naming the same ``pool`` draw
from the same prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmlb_bench.workload.distributions import Distribution, Lengths, Zipf, parse_distribution, parse_lengths
from llmlb_bench.workload.fields import Section


@dataclass(frozen=True)
class ToolTurns:
    """Turns after a tool call: the share of turns (after the first) that are, the tool's time,
    and the tokens of its result (the turn's new input)."""

    share: float
    tool_s: Distribution
    tokens: Lengths

    def draw(self, rng: np.random.Generator, turn: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per request: whether it follows a tool call, the tool's time, its result's tokens."""
        n = len(turn)
        tool = (turn > 0) & (rng.random(n) < self.share)
        return tool, np.maximum(self.tool_s.sample(rng, n), 0.0), self.tokens.sample(rng, n).astype(np.int64)


@dataclass(frozen=True)
class Sessions:
    turns: Lengths
    think_s: Distribution
    tools: ToolTurns | None = None

    def expand(self, rng: np.random.Generator, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per request (session-major order): session index, turn (0-based), think time before it."""
        turns = self.turns.sample(rng, len(starts)).astype(np.int64)
        session = np.repeat(np.arange(len(starts)), turns)
        first = np.concatenate([[0], np.cumsum(turns)[:-1]])
        turn = np.arange(len(session)) - first[session]
        think = np.where(turn > 0, np.maximum(self.think_s.sample(rng, len(session)), 0.0), 0.0)
        return session, turn, think


@dataclass(frozen=True)
class SystemPrompts:
    groups: int
    popularity: float
    tokens: Lengths
    pool: str | None

    def lengths(self, rng: np.random.Generator) -> np.ndarray:
        """Token length of each group's prompt (drawn once per pool, so shared pools agree)."""
        return self.tokens.sample(rng, self.groups).astype(np.int64)

    def assign(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Group of each of ``n`` sessions (or requests): rank 0 is the most popular."""
        if self.popularity == 0:
            return rng.integers(0, self.groups, n)
        return Zipf(self.popularity, self.groups).sample(rng, n).astype(np.int64) - 1


def segment_exclusive_cumsum(values: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Within each run of equal ``segment`` ids (contiguous), the sum of the earlier values."""
    total = np.cumsum(values) - values
    starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]])
    base = np.repeat(total[starts], np.diff(np.r_[starts, len(values)]))
    result: np.ndarray = total - base
    return result


def parse_sessions(s: Section) -> Sessions:
    tools = s.section("tools", None)
    out = Sessions(turns=parse_lengths(s.section("turns")), think_s=parse_distribution(s.section("think_s")),
                   tools=_parse_tools(tools) if tools is not None else None)
    s.finish()
    return out


def _parse_tools(s: Section) -> ToolTurns:
    out = ToolTurns(share=s.number("share", ge=0, le=1), tool_s=parse_distribution(s.section("tool_s")),
                    tokens=parse_lengths(s.section("tokens")))
    s.finish()
    return out


def parse_system_prompts(s: Section) -> SystemPrompts:
    out = SystemPrompts(groups=s.integer("groups", ge=1, le=10_000_000), popularity=s.number("popularity", 1.0, ge=0),
                        tokens=parse_lengths(s.section("tokens")), pool=s.string("pool", None))
    s.finish()
    return out
