"""Load-balancing and scheduling policies, shared by the simulator and the replayer."""

from llmlb_bench.policies.base import HOLD, REJECT, Policy, RouteRequest, RoutingPolicy, TargetInfo, View
from llmlb_bench.policies.registry import BUILTIN, FAMILIES, args_per_policy, make_policy, parse_args

__all__ = ["BUILTIN", "FAMILIES", "HOLD", "Policy", "REJECT", "RouteRequest", "RoutingPolicy", "TargetInfo", "View",
           "args_per_policy", "make_policy", "parse_args"]
