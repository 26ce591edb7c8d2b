"""Agentic fan-out: a request that, once it completes and a tool has run, triggers k children.

Each child is a dependent request (``parent_id``, ``after_parent_s`` = the
tool's delay). Its prompt is the parent's prompt and reply plus the tool's
result, so siblings share the parent's whole context as a prefix and diverge
after it. Children may fan out again, down to ``depth`` generations.

With ``join``, each request that fanned out also gets a join request: the
parent's next call, which waits for *all* its children (``parent_id`` = the
parent, ``wait_ids`` = the children) and then carries the parent's context
plus every child's answer plus ``join_tokens`` of its own (a coordinator
reading its sub-agents' results). It leaves as soon as the last child ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmlb_bench.workload.distributions import Distribution, Lengths, parse_distribution, parse_lengths
from llmlb_bench.workload.fields import Section


@dataclass(frozen=True)
class Fanout:
    children: Lengths
    depth: int
    tool_s: Distribution
    tool_tokens: Lengths
    output: Lengths | None
    join: bool = False
    join_tokens: Lengths | None = None


def parse_fanout(s: Section) -> Fanout:
    join = s.boolean("join", False)
    out = Fanout(children=parse_lengths(s.section("children"), default_min=0), depth=s.integer("depth", 1, ge=1, le=8),
                 tool_s=parse_distribution(s.section("tool_s")), tool_tokens=parse_lengths(s.section("tool_tokens")),
                 output=parse_lengths(s.section("output")) if s.has("output") else None, join=join,
                 join_tokens=parse_lengths(s.section("join_tokens")) if s.has("join_tokens") else None)
    s.finish()
    return out
