"""Load-balancing and scheduling policies, shared by the simulator and the replayer."""

from llmlb_bench.policies.base import Policy, RouteRequest, RoutingPolicy, TargetInfo, View
from llmlb_bench.policies.registry import BUILTIN, make_policy, parse_args

__all__ = ["BUILTIN", "Policy", "RouteRequest", "RoutingPolicy", "TargetInfo", "View", "make_policy", "parse_args"]
