"""Sweep files: which workloads, clusters, policies, loads and seeds to cross, read from TOML.

A sweep is validated completely before any cell runs, so a typo in the
twentieth policy is a one-line error naming the file and the dotted field,
not a crash an hour into the sweep. Labels (the table keys) become parts of
run ids and folder names, so they are restricted to ``[A-Za-z0-9_-]``.

Example (see docs/sweeps.md for every field)::

    name = "policies"
    slo = "ttft=500ms,tpot=50ms"
    repeats = 3

    [workloads]
    chat = { spec = "../workloads/chat.toml", requests = 2000 }

    [clusters]
    a100x4 = { replicas = 4, gpu = "a100-80g" }

    [policies]
    round_robin = {}
    p2c = { policy = "power_of_d", args = { d = 2 } }

    attainment = 0.9                  # the target of capacity (DistServe's max goodput)

    [load]
    load = [0.5, 0.75, 1.0, 1.2]      # x the reference policy's capacity

    [capacity]
    rate = [1, 200]
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import Value, read_toml
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.policies import make_policy
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.profile import resolve_profile
from llmlb_bench.sweep.robustness import RobustnessSpec, parse_robustness
from llmlb_bench.workload import WorkloadSpec, load_spec
from llmlb_bench.workload.fields import Section


#: The x axis of a grid: how the offered rate is given.
AXES = ("rate_scale", "rate", "load")
#: Curve metrics a knee can be taken on: ``<latency>.<stat>``.
KNEE_METRICS = tuple(f"{m}.{s}" for m in ("ttft", "tpot", "itl", "e2e") for s in ("mean", "p50", "p90", "p99"))
_LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class WorkloadEntry:
    """One workload of the sweep: its label and its validated spec (with the sweep's overrides applied)."""

    label: str
    spec: WorkloadSpec

    @property
    def raw(self) -> dict[str, Value]:
        return self.spec.to_dict()


@dataclass(frozen=True)
class ClusterEntry:
    label: str
    config: ClusterConfig

    @property
    def price_per_hour(self) -> float:
        """On-demand USD per hour of the whole fleet (GPUs x catalog price)."""
        return sum(p.replicas * p.gpus * p.gpu_spec(self.config.catalogs).price_per_hour
                   for p in self.config.pools)


@dataclass(frozen=True)
class PolicyEntry:
    label: str
    name: str
    args: Mapping[str, object]
    #: cluster labels this policy runs on (empty: all), e.g. a P/D pairing policy only on split fleets
    clusters: tuple[str, ...] = ()

    def runs_on(self, cluster: str) -> bool:
        return not self.clusters or cluster in self.clusters


@dataclass(frozen=True)
class CapacitySpec:
    """Capacity search: the highest rate whose SLO attainment reaches the sweep's target."""

    low: float
    high: float
    tolerance: float
    reference: str
    policies: tuple[str, ...]


@dataclass(frozen=True)
class SweepSpec:
    name: str
    source: str
    slo: Slo | None
    slo_text: str | None
    seeds: tuple[int, ...]
    workloads: tuple[WorkloadEntry, ...]
    clusters: tuple[ClusterEntry, ...]
    policies: tuple[PolicyEntry, ...]
    axis: str | None
    values: tuple[float, ...]
    capacity: CapacitySpec | None
    knee_metric: str
    #: SLO attainment a rate must keep: for capacity and for maximum goodput
    target: float = 0.9
    description: str = ""
    raw: Mapping[str, object] = field(default_factory=dict, repr=False)
    #: robustness curves (sweep/robustness.py): one knob at a time at a fixed rate
    robustness: RobustnessSpec | None = None

    def pairs(self) -> list[tuple[ClusterEntry, PolicyEntry]]:
        """(cluster, policy) combinations that run, in file order."""
        return [(c, p) for c in self.clusters for p in self.policies if p.runs_on(c.label)]

    def policy(self, label: str) -> PolicyEntry:
        return next(p for p in self.policies if p.label == label)


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file (workload paths are relative to it)."""
    path = Path(path)
    return parse_sweep(read_toml(path, "sweep file (.toml)"), str(path), path.parent, default_name=path.stem)


def parse_sweep(data: Mapping[str, object], source: str, base: Path, default_name: str = "sweep") -> SweepSpec:
    """Validate a parsed sweep table; ``base`` resolves relative workload paths."""
    s = Section(data, "", source)
    name = _label(s, "name", s.string("name", default_name))
    description = s.string("description", "")
    slo_text = s.string("slo", None)
    slo = Slo.parse(slo_text, f"{source}: slo") if slo_text else None
    seeds = _seeds(s)
    knee = s.string("knee_metric", "e2e.mean", choices=KNEE_METRICS)
    target = s.number("attainment", 0.9, gt=0, lt=1)
    workloads = _workloads(s.section("workloads"), base)
    clusters = _clusters(s.section("clusters", None), source)
    policies = _policies(s.section("policies"), source, {c.label for c in clusters})
    axis, values = _grid(s.section("load", None))
    capacity = _capacity(s.section("capacity", None), policies)
    robustness = parse_robustness(s.section("robustness", None))
    s.finish()
    if axis is None and capacity is None and robustness is None:
        raise s.error(None, "nothing to run: give a [load] grid, a [capacity] search, [robustness] knobs, or some")
    if robustness is not None and any(k == "slowdown" for k, _ in robustness.knobs):
        for c in clusters:
            try:
                ClusterConfig.from_dict({**c.config.to_dict(), "slowdowns": [
                    {"target": robustness.slow_target, "at_s": robustness.slow_at_s, "factor": 2.0}]})
            except UserError as exc:
                raise UserError(f"robustness.slow_target: on cluster {c.label!r}: {exc.problem}", source) from None
    if axis == "load" and capacity is None:
        raise s.error("load.load", "offered load is relative to a capacity: add a [capacity] section")
    if capacity is not None and slo is None:
        raise s.error("slo", "a capacity search needs an SLO (e.g. slo = \"ttft=500ms,tpot=50ms\")")
    spec = SweepSpec(name=name, source=source, slo=slo, slo_text=slo_text, seeds=seeds, workloads=workloads,
                     clusters=clusters, policies=policies, axis=axis, values=values, capacity=capacity,
                     knee_metric=knee, target=target, description=description, raw=dict(data),
                     robustness=robustness)
    if axis == "load" and capacity is not None:
        ref = spec.policy(capacity.reference)
        for c in clusters:
            if not ref.runs_on(c.label):
                raise s.error("capacity.reference", f"the reference policy {ref.label!r} must run on every "
                              f"cluster to scale their loads (it does not run on {c.label!r})")
    if not spec.pairs():
        raise s.error("policies", "no policy runs on any cluster (check each policy's clusters list)")
    return spec


def _label(s: Section, key: str, value: str) -> str:
    if not _LABEL.match(value):
        raise s.error(key, f"{value!r} is not a valid label (letters, digits, _ and -, at most 64)")
    return value


def _seeds(s: Section) -> tuple[int, ...]:
    if s.has("seeds") and s.has("repeats"):
        raise s.error("repeats", "give seeds (a list) or repeats (a count), not both")
    if s.has("seeds"):
        raw = s.raw("seeds")
        if not isinstance(raw, list) or not raw:
            raise s.error("seeds", "expected a non-empty list of integers")
        seeds = []
        for i, v in enumerate(raw):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise s.error(f"seeds[{i}]", f"expected a non-negative integer, got {v!r}")
            seeds.append(v)
        if len(set(seeds)) != len(seeds):
            raise s.error("seeds", "seeds repeat; each repeat needs its own seed")
        return tuple(seeds)
    return tuple(range(s.integer("repeats", 1, ge=1, le=10_000)))


def _workloads(s: Section, base: Path) -> tuple[WorkloadEntry, ...]:
    if not s.data:
        raise s.error(None, "list at least one workload, e.g. chat = \"workloads/chat.toml\"")
    out: list[WorkloadEntry] = []
    for label, value in s.items():
        _label(s, label, label)
        sub: Section | None
        if isinstance(value, str):  # chat = "path" is short for chat = { spec = "path" }
            s.raw(label)
            sub = Section({"spec": value}, s.dotted(label), s.source)
        else:
            sub = s.section(label)
            assert sub is not None
        spec_path = base / sub.string("spec")
        if not spec_path.is_file():
            raise sub.error("spec", f"no such workload spec: {spec_path}")
        overrides = {"requests": sub.integer("requests", None, ge=1),
                     "duration_s": sub.number("duration_s", None, gt=0)}
        sub.finish()
        if overrides["requests"] is not None and overrides["duration_s"] is not None:
            raise sub.error("duration_s", "give requests or duration_s, not both")
        spec = load_spec(spec_path).replace(**overrides)
        out.append(WorkloadEntry(label, spec))
    return tuple(out)


def _clusters(s: Section | None, source: str) -> tuple[ClusterEntry, ...]:
    if s is None or not s.data:
        return (ClusterEntry("default", ClusterConfig.build()),)
    out = []
    for label, _ in s.items():
        _label(s, label, label)
        sub = s.section(label)
        assert sub is not None
        try:
            data = dict(sub.data)
            if data.get("profile") is not None:      # a measured profile's path is relative to the sweep file
                data["profile"] = resolve_profile(data["profile"], Path(source).parent)
            cfg = ClusterConfig.from_dict(data)
        except UserError as exc:
            raise UserError(f"clusters.{label}: {exc.line()}", source) from None
        except TypeError as exc:  # a wrongly typed field the config does not check itself
            raise UserError(f"clusters.{label}: {exc}", source) from None
        out.append(ClusterEntry(label, cfg))
    return tuple(out)


def _policies(s: Section, source: str, clusters: set[str]) -> tuple[PolicyEntry, ...]:
    if not s.data:
        raise s.error(None, "list at least one policy, e.g. round_robin = {}")
    out = []
    for label, _ in s.items():
        _label(s, label, label)
        sub = s.section(label)
        assert sub is not None
        name = sub.string("policy", label)
        args = dict(sub.section("args", {}).data)
        only = sub.raw("clusters", [])
        if not isinstance(only, list) or not all(isinstance(c, str) for c in only):
            raise sub.error("clusters", "expected a list of cluster labels")
        for c in only:
            if c not in clusters:
                raise sub.error("clusters", f"unknown cluster {c!r} (clusters: {', '.join(sorted(clusters))})")
        sub.finish()
        try:
            make_policy(name, args)
        except UserError as exc:
            raise UserError(f"policies.{label}: {exc.problem}", source) from None
        out.append(PolicyEntry(label, name, args, tuple(only)))
    return tuple(out)


def _grid(s: Section | None) -> tuple[str | None, tuple[float, ...]]:
    if s is None:
        return None, ()
    given = [a for a in AXES if s.has(a)]
    if len(given) != 1:
        raise s.error(None, f"give exactly one of {', '.join(AXES)} (a list of values)")
    axis = given[0]
    values = s.numbers(axis, gt=0)
    s.finish()
    if len(set(values)) != len(values):
        raise s.error(axis, "values repeat")
    return axis, tuple(sorted(values))


def _capacity(s: Section | None, policies: tuple[PolicyEntry, ...]) -> CapacitySpec | None:
    if s is None:
        return None
    bracket = s.numbers("rate", gt=0)
    if len(bracket) != 2 or not bracket[0] < bracket[1]:
        raise s.error("rate", "expected [low, high] request rates (req/s) with low < high")
    tolerance = s.number("tolerance", 0.02, ge=1e-4, le=1)
    labels = [p.label for p in policies]
    chosen = s.raw("policies", labels)
    if not isinstance(chosen, list) or not chosen or any(c not in labels for c in chosen):
        raise s.error("policies", f"expected a list of policy labels from [policies] ({', '.join(labels)})")
    reference = s.string("reference", chosen[0], choices=chosen)
    s.finish()
    return CapacitySpec(bracket[0], bracket[1], tolerance, reference, tuple(chosen))
