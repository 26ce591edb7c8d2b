"""What one engine step of a replica runs, planned at a step boundary and applied at the next.

The replica's scheduler (sim/replica.py) fills a plan in vLLM's order: room for the running
decodes' new KV blocks (preempting victims when they do not fit), the running prefills' next
chunks, then, unless that preempted anyone, swapped-out and waiting requests while the token
budget, the batch size and the free blocks allow. Its timing turns the plan into a step length
and power (or a run of identical decode steps when the plan has no prefill chunk), and its
execution applies the chunks when the step ends. One plan per replica is reused from step to
step (plain stores, no allocation on the hot path): the chunks are emptied when applied, and
``link_s`` when a step pays it, so host-link copies booked while nothing could run are paid by
the next step that runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmlb_bench.sim.replica import Request


class StepPlan:
    """The step being planned (then in flight) on one replica."""

    __slots__ = ("chunks", "preempted", "budget", "free", "need", "link_s")

    def __init__(self) -> None:
        #: prefill chunks as (request, prompt tokens computed at this step), in admission order
        #: (decodes are not listed: every running request in decode makes one step)
        self.chunks: list[tuple[Request, int]] = []
        #: a request was preempted (recomputed or swapped out) to make room: nobody is admitted
        self.preempted = False
        #: while planning: token budget left after the decodes and the chunks so far ...
        self.budget = 0
        #: ... free KV blocks left ...
        self.free = 0
        #: ... and new blocks the decodes take at this step (held back from ``free``)
        self.need = 0
        #: host-link seconds the step spends before its forward pass (KV swap copies, LoRA loads)
        self.link_s = 0.0
