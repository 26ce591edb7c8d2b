"""Where each run's latency counts from: the request's arrival, or the moment it was sent.

Latency counts from the request's **arrival** (``scheduled_s``) wherever the
router is part of the system under test, so a router-side queue
(``fcfs_queue``, ``edf``, ``predicted_sjf``) shows in TTFT, E2E and
attainment instead of hiding behind the moment the router released the
request (``sent_s``):

* simulated runs: ``scheduled_s`` is when the request reached the simulated
  router (after its parent, for dependents) and ``sent_s`` when the router
  released it to a replica, so ``sent_s - scheduled_s`` is the **router
  wait**;
* replays whose own routing policy holds requests (a policy with a
  router-side queue): the held time sits between ``scheduled_s`` and
  ``sent_s`` too, together with the client's lag, which a row cannot tell
  apart; latency counts from arrival and the report flags that it includes
  the client's lag (the run's self-check gives its size);
* ``llmlb route`` runs: the proxy is the router; ``scheduled_s`` is when the
  request reached it and ``sent_s`` when it forwarded it, so latency counts
  from arrival and ``sent_s - scheduled_s`` is the router wait;
* other replays and imported runs: the router, if any, sits behind the
  endpoint (``llmlb serve``, a router process), so its queue is already
  inside ``first_token_s - sent_s``; latency counts from ``sent_s`` and
  ``sent_s - scheduled_s`` is the **client lag**, reported on its own and
  flagged above the replay's lag threshold, never added to latency.
"""

from __future__ import annotations

from typing import Mapping

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.meta import table

ARRIVAL = "arrival"
SENT = "sent"
#: a replay's client lag is flagged above this p99 (ms) when run.json names no threshold of its own
DEFAULT_LAG_THRESHOLD_MS = 5.0


def _policy_name(meta: Mapping[str, object]) -> str | None:
    policy = table(meta, "config").get("policy")
    if isinstance(policy, dict):
        policy = policy.get("name")
    return policy if isinstance(policy, str) else None


def holds_requests(policy: str | None) -> bool:
    """Whether the named policy has a router-side queue (it overrides ``Policy.release``)."""
    if not policy:
        return False
    from llmlb_bench.policies.base import Policy
    from llmlb_bench.policies.registry import policy_class

    try:
        cls = policy_class(policy)
    except UserError:
        return False
    return getattr(cls, "release", Policy.release) is not Policy.release


def latency_from(meta: Mapping[str, object]) -> str:
    """:data:`ARRIVAL` or :data:`SENT` for a run, from its run.json (see the module docstring)."""
    backend = meta.get("backend")
    if backend in ("sim", "route"):
        return ARRIVAL
    if backend == "replay" and holds_requests(_policy_name(meta)):
        return ARRIVAL
    return SENT


def wait_kind(meta: Mapping[str, object]) -> str:
    """What ``sent_s - scheduled_s`` is in a run: ``router`` wait, ``client`` lag, or ``router+client``."""
    if meta.get("backend") in ("sim", "route"):
        return "router"
    return "router+client" if latency_from(meta) == ARRIVAL else "client"


def lag_threshold_ms(meta: Mapping[str, object]) -> float:
    given = table(meta, "summary", "client").get("lag_threshold_ms")
    return float(given) if isinstance(given, (int, float)) and given else DEFAULT_LAG_THRESHOLD_MS


def arrival_runs(metas: Mapping[str, Mapping[str, object]]) -> list[str]:
    """The run ids whose latency counts from arrival."""
    return sorted(r for r, m in metas.items() if latency_from(m) == ARRIVAL)
