"""Workload specs: TOML files that compose tenants into one trace.

A spec is read once, validated completely (every problem is a one-line
:class:`UserError` naming the file and the dotted field), and kept together
with the raw table it came from, so ``to_dict()`` can travel in the trace's
metadata and rebuild exactly the same spec later.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, TypeVar

from llmlb_bench.tomlfile import Value, read_toml
from llmlb_bench.workload.adapters import Adapters, parse_adapters
from llmlb_bench.workload.agents import Fanout, parse_fanout
from llmlb_bench.workload.arrivals import ArrivalProcess, parse_arrival
from llmlb_bench.workload.distributions import Lengths, parse_lengths
from llmlb_bench.workload.fields import Section
from llmlb_bench.workload.multimodal import Multimodal, parse_multimodal
from llmlb_bench.workload.reasoning import Reasoning, parse_reasoning
from llmlb_bench.workload.sessions import Sessions, SystemPrompts, parse_sessions, parse_system_prompts

T = TypeVar("T")

#: Default prefix-hash block size: vLLM's default KV block.
DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class TenantSpec:
    """One client class: its arrivals, its lengths, its content and how it is served.

    With ``sessions`` the arrival process gives session starts and ``input``
    is the new user message of each turn; without, each arrival is one request.
    """

    name: str
    arrival: ArrivalProcess
    input: Lengths
    output: Lengths
    io_correlation: float = 0.0
    kind: str = "chat"
    slo_class: str = "default"
    priority: int = 0
    sessions: Sessions | None = None
    system_prompt: SystemPrompts | None = None
    multimodal: Multimodal | None = None
    fanout: Fanout | None = None
    max_context: int | None = None
    label: str = ""
    #: the LoRA adapters its requests name (None: all go to the base model)
    adapters: Adapters | None = None
    #: how much of its output is reasoning (None: none)
    reasoning: Reasoning | None = None

    @property
    def tenant(self) -> str:
        """The value of the trace's ``tenant`` column: ``label``, else the table's name.

        Several spec tenants may share a label, e.g. one client whose lengths
        change over the day, modelled as one spec tenant per period.
        """
        return self.label or self.name

    @property
    def has_prefix_structure(self) -> bool:
        return self.sessions is not None or self.system_prompt is not None or self.fanout is not None

    def requests_per_arrival(self) -> float:
        """Expected requests per arrival: turns per session times (1 + descendants per request)."""
        turns = self.sessions.turns.mean() if self.sessions else 1.0
        children = self.fanout.children.mean() if self.fanout else 0.0
        depth = self.fanout.depth if self.fanout else 0
        return turns * (1.0 + sum(children**d for d in range(1, depth + 1)))


@dataclass(frozen=True)
class WorkloadSpec:
    """A validated workload spec. Build with :func:`load_spec` or :meth:`from_dict`."""

    tenants: tuple[TenantSpec, ...]
    seed: int
    requests: int | None
    duration_s: float | None
    block_size: int
    rate_scale: float
    time_scale: float
    raw: Mapping[str, object] = field(repr=False)
    source: str = "<spec>"
    prefix_hashes: bool | None = None

    @property
    def emit_prefix_hashes(self) -> bool:
        """Hashes are written when asked, or by default when some tenant shares prefixes."""
        if self.prefix_hashes is not None:
            return self.prefix_hashes
        return any(t.has_prefix_structure for t in self.tenants)

    @classmethod
    def from_dict(cls, data: Mapping[str, object], source: str = "<spec>") -> WorkloadSpec:
        """Validate ``data`` (a parsed TOML table); ``source`` names it in errors."""
        return _parse(Section(data, "", source), copy.deepcopy(dict(data)))

    def to_dict(self) -> dict[str, Value]:
        """The spec as a JSON-able dict; ``from_dict(to_dict())`` generates the same trace."""
        result: dict[str, Value] = json.loads(json.dumps(self.raw))
        return result

    def replace(self, **changes: object) -> WorkloadSpec:
        """A copy with top-level fields changed (``seed``, ``requests``, ``duration_s``, ...).

        Setting ``requests`` clears ``duration_s`` and vice versa, so a
        command-line override of the run length always wins over the file.
        """
        data = dict(self.raw)
        for key, value in changes.items():
            if value is None:
                continue
            if key == "requests":
                data.pop("duration_s", None)
            if key == "duration_s":
                data.pop("requests", None)
            data[key] = value
        return WorkloadSpec.from_dict(data, self.source)

    @property
    def tenant_names(self) -> list[str]:
        return [t.name for t in self.tenants]


def load_spec(path: str | Path) -> WorkloadSpec:
    """Read and validate a workload spec file."""
    return WorkloadSpec.from_dict(read_toml(path, "workload spec (.toml)"), str(path))


def _parse(s: Section, raw: dict[str, object]) -> WorkloadSpec:
    s.string("name", "")
    s.string("description", "")
    seed = s.integer("seed", 0, ge=0, le=2**63 - 1)
    requests = s.integer("requests", None, ge=1)
    duration = s.number("duration_s", None, gt=0)
    if (requests is None) == (duration is None):
        raise s.error("requests" if requests is None else "duration_s",
                      "give exactly one of requests (a count) or duration_s (seconds)")
    block_size = s.integer("block_size", DEFAULT_BLOCK_SIZE, ge=1, le=1 << 20)
    rate_scale = s.number("rate_scale", 1.0, gt=0)
    time_scale = s.number("time_scale", 1.0, gt=0)
    prefix_hashes = s.boolean("prefix_hashes", None) if s.has("prefix_hashes") else None
    tenants_s = s.section("tenants")
    if not tenants_s.data:
        raise s.error("tenants", "must define at least one tenant ([tenants.<name>])")
    tenants = []
    for name, _ in tenants_s.items():
        tenants.append(_tenant(tenants_s.section(name), name))
    tenants_s.finish()
    s.finish()
    return WorkloadSpec(tenants=tuple(tenants), seed=seed, requests=requests, duration_s=duration,
                        block_size=block_size, rate_scale=rate_scale, time_scale=time_scale, raw=raw,
                        source=s.source, prefix_hashes=prefix_hashes)


def _tenant(s: Section, name: str) -> TenantSpec:
    spec = TenantSpec(
        name=name,
        arrival=parse_arrival(s.section("arrival")),
        input=parse_lengths(s.section("input")),
        output=parse_lengths(s.section("output")),
        io_correlation=s.number("io_correlation", 0.0, gt=-1, lt=1),
        kind=s.string("kind", "chat"),
        slo_class=s.string("slo_class", "default"),
        priority=s.integer("priority", 0, ge=-128, le=127),
        sessions=_optional(s, "sessions", parse_sessions),
        system_prompt=_optional(s, "system_prompt", parse_system_prompts),
        multimodal=_optional(s, "multimodal", parse_multimodal),
        fanout=_optional(s, "fanout", parse_fanout),
        max_context=s.integer("max_context", None, ge=1),
        label=s.string("label", ""),
        adapters=_optional(s, "adapters", parse_adapters),
        reasoning=_optional(s, "reasoning", parse_reasoning),
    )
    s.finish()
    return spec


def _optional(s: Section, key: str, parse: Callable[[Section], T]) -> T | None:
    sub = s.section(key, None)
    return parse(sub) if sub is not None else None
