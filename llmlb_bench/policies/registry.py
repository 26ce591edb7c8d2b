"""Look up routing policies by name, with ``key=value`` parameters.

A name is either a built-in policy's ``name`` or a dotted path
``package.module:ClassName`` to a user's own class, so users plug in a
policy without editing this package.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Mapping

from llmlb_bench.errors import UserError
from llmlb_bench.plugins import load_class
from llmlb_bench.policies.affinity import ConsistentHash
from llmlb_bench.policies.bandit import LinUcb
from llmlb_bench.policies.base import Policy
from llmlb_bench.policies.cache_aware import CacheAware
from llmlb_bench.policies import control
from llmlb_bench.policies.control import ConcurrencyLimit, PiAdmission
from llmlb_bench.policies.hetero import CapacityWeighted, PrefillDecodePair
from llmlb_bench.policies.kv_cost import DynamoKvCost
from llmlb_bench.policies.learned import LearnedPolicy
from llmlb_bench.policies.lora import LoraAffinity
from llmlb_bench.policies.preble import Preble
from llmlb_bench.policies.predictive import LeastPredictedWork
from llmlb_bench.policies.queueing import EarliestDeadlineFirst, PredictedShortestFirst, RouterQueue
from llmlb_bench.policies.routing import (FewestWaiting, LeastOutstanding, LeastTokens, PowerOfD, RandomChoice,
                                          RoundRobin)
from llmlb_bench.policies.scorers import LlmdScorers
from llmlb_bench.policies.slo import AdmissionControl, PredictedTtft
from llmlb_bench.tomlfile import unknown_choice

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

#: Built-in policies by name, grouped by family (the order ``llmlb policies`` lists them in).
FAMILIES: dict[str, tuple[type[Policy], ...]] = {
    "classic": (RandomChoice, RoundRobin, LeastOutstanding, LeastTokens, PowerOfD, ConsistentHash, FewestWaiting),
    "kv/locality": (CacheAware, LlmdScorers, DynamoKvCost, Preble),
    "queue/slo": (PredictedTtft, AdmissionControl, RouterQueue, EarliestDeadlineFirst),
    "predictive": (LeastPredictedWork, PredictedShortestFirst),
    "heterogeneity": (CapacityWeighted, PrefillDecodePair),
    "lora": (LoraAffinity,),
    "control": (PiAdmission, ConcurrencyLimit),
    "learning": (LinUcb, LearnedPolicy),
}
BUILTIN: dict[str, type[Policy]] = {cls.name: cls for group in FAMILIES.values() for cls in group}


#: a ``--policy-arg`` value as the command line gives it
ArgValue = bool | int | float | str


def parse_args(pairs: list[str] | None, where: str = "--policy-arg") -> dict[str, ArgValue]:
    """Parse ``key=value`` strings; values become int, float, bool or str."""
    out: dict[str, ArgValue] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise UserError(f"expected key=value, got {pair!r}", where)
        out[key.strip()] = _coerce(raw.strip())
    return out


def _coerce(raw: str) -> ArgValue:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


#: Entry-point group through which installed packages add routing policies:
#: ``[project.entry-points."llmlb_bench.policies"] my_policy = "pkg.mod:MyPolicy"``.
ENTRY_POINT_GROUP = "llmlb_bench.policies"


def _entry_point(name: str) -> EntryPoint | None:
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    return found[0] if found else None


def policy_class(name: str) -> type[Policy]:
    """A policy class by built-in name, installed entry-point name, or ``module:Class`` path."""
    if name in BUILTIN:
        return BUILTIN[name]
    ep = _entry_point(name)
    if ep is not None:
        try:
            loaded: type[Policy] = ep.load()
            return loaded
        except (ImportError, AttributeError) as exc:
            raise UserError(f"cannot load policy {name!r} from entry point {ep.value!r}: {exc}", "--policy") from None
    if ":" in name:
        cls: type[Policy] = load_class(name, "policy", "--policy")   # a protocol: its answers are checked by the Router
        return cls
    raise unknown_choice("policy", name, sorted(BUILTIN), "--policy")


def make_policy(name: str, args: Mapping[str, object] | None = None, seed: int | None = None) -> Policy:
    """Instantiate a policy, checking parameter names (and, for built-ins, types).

    ``seed`` (the run's seed) is passed to a policy whose constructor takes
    ``seed`` unless ``args`` sets it, so randomised policies follow the run.
    """
    cls = policy_class(name)
    args = dict(args or {})
    sig = inspect.signature(cls.__init__)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    unknown = [k for k in args if k not in sig.parameters or k == "self"]
    if unknown and not accepts_any:
        known = ", ".join(k for k in sig.parameters if k != "self") or "none"
        raise UserError(f"policy {name!r} has no parameter {unknown[0]!r} (parameters: {known})", "--policy-arg")
    for key, value in args.items():
        if key in cls.params:
            check_param_type(f"policy {name!r}", key, value, cls.params[key][0])
    if seed is not None and "seed" in sig.parameters and "seed" not in args:
        args["seed"] = seed
    try:
        return cls(**args)
    except (TypeError, ValueError) as exc:
        raise UserError(f"policy {name!r}: {exc}", "--policy-arg") from None


def _accepted(name: str) -> tuple[set[str], bool]:
    sig = inspect.signature(policy_class(name).__init__)
    return set(sig.parameters) - {"self"}, any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


def args_per_policy(names: list[str], args: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """Share one ``--policy-arg`` list among several compared policies.

    ``NAME.key=value`` goes to policy NAME only; a plain ``key=value`` goes to
    every policy that has that parameter. A key no compared policy takes is
    an error, so a typo is never silently ignored.
    """
    out: dict[str, dict[str, object]] = {n: {} for n in names}
    for key, value in args.items():
        scope, dot, param = key.rpartition(".")
        if dot and scope in out:
            out[scope][param] = value
            continue
        takers = [n for n in names if key in _accepted(n)[0] or _accepted(n)[1]]
        if not takers:
            raise UserError(f"no compared policy has a parameter {key!r} ({', '.join(names)})", "--policy-arg")
        for n in takers:
            out[n][key] = value
    return out


def check_param_type(what: str, key: str, value: object, default: object, where: str = "--policy-arg") -> None:
    """A value must have its default's type; an int is accepted where a float is expected.
    ``what`` names the owner in the message, e.g. ``"policy 'random'"``."""
    want = type(default)
    ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise UserError(f"{what}: parameter {key!r} expects {want.__name__}, got {value!r}", where)


def _inner_policy(name: str, args: str, seed: int) -> Policy:
    """A controller's inner policy from its name and ``key=value,...`` text (``inner_args``)."""
    pairs = [p for p in (s.strip() for s in args.split(",")) if p]
    return make_policy(name, parse_args(pairs, "--policy-arg inner_args"), seed=seed)


control.inner_factory = _inner_policy
