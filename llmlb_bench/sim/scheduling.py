"""How the simulator finds a replica's engine scheduler: a built-in by name, or a
user's class by ``package.module:Class``.

The schedulers themselves (the interface, FCFS, vLLM's priority order, predicted
SJF, VTC, deadline) are policies and live in :mod:`llmlb_bench.policies.schedulers`.
Each replica gets its own instance, because a scheduler keeps per-replica state
(its waiting queue, service counters, predictor stream).
"""

from __future__ import annotations

import inspect
from typing import Mapping

from llmlb_bench.errors import UserError
from llmlb_bench.plugins import load_class
from llmlb_bench.policies.schedulers import ENGINE_SCHEDULERS, EngineScheduler
from llmlb_bench.policies.registry import check_param_type
from llmlb_bench.tomlfile import unknown_choice

__all__ = ["ENGINE_SCHEDULERS", "EngineScheduler", "make_engine_scheduler", "scheduler_class"]


def scheduler_class(name: str) -> type[EngineScheduler]:
    where = "cluster.scheduler"
    if name in ENGINE_SCHEDULERS:
        return ENGINE_SCHEDULERS[name]
    if ":" in name:
        cls: type[EngineScheduler] = load_class(name, "engine scheduler", where, EngineScheduler)
        return cls
    raise unknown_choice("engine scheduler", name, [*ENGINE_SCHEDULERS, "package.module:Class"], where)


def make_engine_scheduler(name: str, args: Mapping[str, object] | None = None,
                          seed: int | None = None) -> EngineScheduler:
    """A new scheduler instance; ``seed`` (the run's) goes to a scheduler that takes one
    unless ``args`` sets it, as for routing policies."""
    cls = scheduler_class(name)
    args = dict(args or {})
    for key, value in args.items():
        if key in cls.params:
            check_param_type(f"engine scheduler {name!r}", key, value, cls.params[key][0], "cluster.scheduler_args")
    if seed is not None and "seed" not in args and "seed" in inspect.signature(cls.__init__).parameters:
        args["seed"] = seed
    try:
        return cls(**args)
    except (TypeError, ValueError) as exc:
        raise UserError(f"engine scheduler {name!r}: {exc}", "cluster.scheduler_args") from None
