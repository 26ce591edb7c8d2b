"""Load-balancing and scheduling policies, shared by the simulator, ``llmlb serve`` and the replayer."""

from llmlb_bench.policies.base import (HOLD, REJECT, Decision, Outcome, PairDecision, Policy, Released, RouteRequest,
                                       TargetInfo, Verdict, View)
from llmlb_bench.policies.registry import BUILTIN, FAMILIES, args_per_policy, make_policy, parse_args
from llmlb_bench.policies.router import PolicyError, Router

__all__ = ["BUILTIN", "Decision", "FAMILIES", "HOLD", "Outcome", "PairDecision", "Policy", "PolicyError", "REJECT", "Released",
           "RouteRequest", "Router", "TargetInfo", "Verdict", "View", "args_per_policy", "make_policy", "parse_args"]
