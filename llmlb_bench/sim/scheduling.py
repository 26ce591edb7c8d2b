"""Engine-level scheduling: the order in which a replica admits waiting requests and the
victim it preempts when KV blocks run out.

vLLM v1 has two orders, both built in here:

* ``fcfs`` (default): admit in arrival order; preempt the most recently admitted
  running request; a preempted request goes back to the head of the queue.
* ``priority`` (``--scheduling-policy priority``): admit the smallest
  ``(priority, arrival)`` first; preempt the running request with the largest
  ``(priority, arrival)``; a preempted request rejoins the queue by its key.

Other engine-level policies (shortest predicted job first, fairness counters,
deadlines) subclass :class:`EngineScheduler` and are named by a dotted path
``package.module:Class`` in ``ClusterConfig.scheduler``. The replica calls

* ``pick(waiting, now)``: index into ``waiting`` (in arrival order) of the request to
  try next; the replica stops admitting when that one does not fit (no skipping,
  like vLLM);
* ``victim(running, now)``: the running request (in admission order) to preempt;
* ``on_tokens(req, prompt_tokens, output_tokens, now)``: tokens just computed for
  ``req`` (a prefill chunk, or a request's decode tokens when it leaves the batch),
  for policies that keep per-tenant service counters.

``FCFS`` is the replica's built-in fast path; any other scheduler keeps the
waiting queue as a list, which costs O(waiting) per admission.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar, Mapping, Sequence

from llmlb_bench.errors import UserError


class EngineScheduler:
    """FCFS: the base class, and vLLM's default order."""

    name: ClassVar[str] = "fcfs"
    #: whether the replica may use its deque fast path (only FCFS)
    fcfs: ClassVar[bool] = True

    def pick(self, waiting: Sequence[Any], now: float) -> int:
        return 0

    def victim(self, running: Sequence[Any], now: float) -> Any:
        return running[-1]

    def on_tokens(self, req: Any, prompt_tokens: int, output_tokens: int, now: float) -> None:
        return None


class PriorityScheduler(EngineScheduler):
    """vLLM's priority scheduling: lower ``priority`` values first, then earlier arrivals."""

    name = "priority"
    fcfs = False

    @staticmethod
    def _key(req: Any) -> tuple[int, float, int]:
        r = req.route
        return (r.priority, r.arrival_s, r.request_id)

    def pick(self, waiting: Sequence[Any], now: float) -> int:
        return min(range(len(waiting)), key=lambda i: self._key(waiting[i]))

    def victim(self, running: Sequence[Any], now: float) -> Any:
        return max(running, key=self._key)


BUILTIN_SCHEDULERS: dict[str, type[EngineScheduler]] = {c.name: c for c in (EngineScheduler, PriorityScheduler)}


def make_engine_scheduler(name: str, args: Mapping[str, Any] | None = None) -> EngineScheduler:
    """A built-in scheduler by name, or a user's class by ``package.module:Class``."""
    where = "cluster.scheduler"
    if name in BUILTIN_SCHEDULERS:
        cls: Any = BUILTIN_SCHEDULERS[name]
    elif ":" in name:
        mod, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as exc:
            raise UserError(f"cannot load engine scheduler {name!r}: {exc}", where) from None
        if not (isinstance(cls, type) and issubclass(cls, EngineScheduler)):
            raise UserError(f"{name!r} is not an EngineScheduler subclass", where)
    else:
        raise UserError(f"unknown engine scheduler {name!r} (known: {', '.join(BUILTIN_SCHEDULERS)}, "
                        f"or package.module:Class)", where)
    try:
        return cls(**dict(args or {}))
    except TypeError as exc:
        raise UserError(f"engine scheduler {name!r}: {exc}", "cluster.scheduler_args") from None
