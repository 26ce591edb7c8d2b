"""What cluster to simulate: pools of replicas, their hardware, model and engine settings.

``ClusterConfig`` is a frozen, JSON-able record stored in every run's
run.json, so a simulated run can be reproduced from its results folder
alone (``ClusterConfig.from_dict(run_json["config"]["cluster"])``). The
settings (a cluster file, flags, keyword arguments) are parsed once, by
``ClusterConfig.from_dict`` / ``ClusterConfig.build``, into typed values:
``pools`` is a tuple of resolved :class:`PoolConfig`, a profile its content,
``autoscale`` / ``moe`` are checked into their specs.
Engine defaults follow vLLM v1's defaults for online serving.

The simple form describes N identical replicas::

    ClusterConfig.build(replicas=4, gpu="h100-sxm", model="llama-3-8b")

Heterogeneous and disaggregated clusters list pools; a pool's unset fields
take the top-level values, and ``replicas`` becomes the total::

    ClusterConfig.build(model="llama-3-70b", tp=4, pools=[
        {"name": "prefill", "replicas": 2, "gpu": "h100-sxm"},      # role from the name
        {"name": "decode", "replicas": 6, "gpu": "a100-80g"}])
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, TypedDict, TypeGuard

from llmlb_bench.errors import UserError
from llmlb_bench.tomlfile import as_table, check_fields, check_types, construct, read_toml
from llmlb_bench.sim.catalog import GPU, Model, load_catalog
from llmlb_bench.sim.lora import VLLM_LORA_RANKS
from llmlb_bench.sim.moe import MoeSpec, check_layout
from llmlb_bench.sim.autoscale import AutoscaleSpec
from llmlb_bench.sim.green import GreenSpec
from llmlb_bench.sim.scheduling import make_engine_scheduler
from llmlb_bench.sim.profile import EngineProfile, ProfileDoc, resolve_profile
from llmlb_bench.sim.speculative import SpeculativeSpec

ROLES = ("mixed", "prefill", "decode")
PREEMPTION_MODES = ("recompute", "swap")
FAILURE_MODES = ("retry", "fail")
TOKEN_TIMES = ("segments", "summary")

#: fields a pool may set (the rest of ClusterConfig is cluster-wide)
POOL_FIELDS = ("replicas", "gpu", "model", "tp", "pp", "max_num_seqs", "max_num_batched_tokens", "block_size",
               "gpu_memory_utilization", "chunked_prefill", "enable_prefix_caching", "max_model_len", "preemption",
               "swap_space_gib", "profile", "speculative", "max_loras", "max_cpu_loras", "lora_rank",
               "lora_adapter_mib", "lora_fetch_gb_s", "gpu_clock", "power_cap_w")
#: engine settings a pool with a measured profile takes from it unless the pool sets them (sim/profile.py);
#: the KV block size always comes from the profile (its KV block count is in those blocks)
PROFILE_ENGINE_FIELDS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len")


class _Scheduled(TypedDict):
    target: str
    at_s: float


class Scheduled(_Scheduled, total=False):
    """A scheduled event of one replica (checked by ClusterConfig._check): a failure, ``{"target": "r1",
    "at_s": 60, "down_s": 30}`` (down_s: mttr_s), or a slowdown, ``{"target": "r1", "at_s": 60, "factor": 2.0,
    "for_s": 30}`` (for_s: to the end). One type for both, as the simulator reads them with one loop variable."""

    down_s: float
    factor: float
    for_s: float


@dataclass(frozen=True)
class PoolConfig:
    """One pool of identical replicas (fully resolved)."""

    name: str
    role: str
    replicas: int
    gpu: str
    model: str
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    gpu_memory_utilization: float
    chunked_prefill: bool
    enable_prefix_caching: bool
    max_model_len: int | None
    # defaulted so that pool records stored before these settings existed still load
    preemption: str = "recompute"
    swap_space_gib: float = 4.0
    pp: int = 1
    #: a measured engine profile's content (sim/profile.py, ``llmlb calibrate``): its step times,
    #: KV blocks and engine settings replace the roofline's; None = the roofline
    profile: ProfileDoc | None = None
    #: speculative decoding (sim/speculative.py): {"method", "num_speculative_tokens", "acceptance",
    #: "acceptance_by", "classes", "draft_model", "cost_ratio"}; None = one token per step
    speculative: Mapping[str, object] | None = None
    # multi-LoRA (sim/lora.py); max_loras = 0: no adapters
    max_loras: int = 0
    max_cpu_loras: int | None = None
    lora_rank: int = 16
    lora_adapter_mib: float | None = None
    lora_fetch_gb_s: float = 2.0
    # green knobs (sim/cost.py ``set_clock``): SM clock as a fraction of the maximum, power limit per GPU
    gpu_clock: float = 1.0
    power_cap_w: float | None = None

    @property
    def speculative_spec(self) -> SpeculativeSpec | None:
        """``speculative`` parsed (checked when the cluster was parsed)."""
        return SpeculativeSpec.parse(self.speculative, "speculative") if self.speculative is not None else None

    @property
    def gpus(self) -> int:
        """GPUs per replica: tp x pp."""
        return self.tp * self.pp

    def gpu_spec(self, catalogs: tuple[str, ...] = ()) -> GPU:
        return load_catalog(catalogs).gpu(self.gpu)

    def model_spec(self, catalogs: tuple[str, ...] = ()) -> Model:
        return load_catalog(catalogs).model(self.model)


@dataclass(frozen=True)
class ClusterConfig:
    """The simulated cluster, parsed: made by :meth:`build` or :meth:`from_dict` (which check the
    settings and resolve the pools), never rewritten after. Every setting has a default; see the
    module docstring for pools."""

    #: number of replicas (each replica is one engine instance on ``tp`` GPUs); with pools: the total
    replicas: int = 4
    gpu: str = "a100-80g"
    model: str = "llama-3-8b"
    #: tensor-parallel degree: GPUs per pipeline stage
    tp: int = 1
    #: pipeline-parallel degree: stages per replica, so a replica has tp x pp GPUs (see sim/cost.py for
    #: what is modelled: no micro-batching, one batch through the stages in turn)
    pp: int = 1
    #: vLLM ``max_num_seqs``: at most this many requests in the running batch (None: vLLM's default for the GPU)
    max_num_seqs: int | None = None
    #: vLLM ``max_num_batched_tokens``: token budget of one engine step (None: vLLM's default for the GPU)
    max_num_batched_tokens: int | None = None
    #: KV-cache block size in tokens
    block_size: int = 16
    #: fraction of GPU memory the engine may use for weights, activations and KV cache
    gpu_memory_utilization: float = 0.9
    #: split long prefills across steps (vLLM v1 default); when off, a prompt waits for a step with room for all of it
    chunked_prefill: bool = True
    #: reuse KV of shared prompt prefixes (vLLM v1 default); needs the trace's ``prefix_hashes``
    enable_prefix_caching: bool = True
    #: longest prompt + output a request may have; ``None`` = the model's context length
    max_model_len: int | None = None
    #: what a replica does with a request it preempts when KV blocks run out: "recompute" (vLLM v1, the
    #: only mode it has: drop the KV, prefill again later) or "swap" (vLLM v0's ``preemption_mode="swap"``:
    #: copy the KV to CPU memory over the host link and back; recompute when the swap space is full)
    preemption: str = "recompute"
    #: CPU memory per GPU for swapped-out KV blocks, GiB (vLLM's ``swap_space``, default 4); used by "swap"
    swap_space_gib: float = 4.0
    #: multi-LoRA (sim/lora.py, vLLM's ``--enable-lora``): at most this many distinct adapters in one
    #: running batch, and as many GPU slots (vLLM ``--max-loras``); 0 = no LoRA: requests that name an
    #: adapter fail, as at a vLLM started without adapters
    max_loras: int = 0
    #: adapters kept in host memory (vLLM ``--max-cpu-loras``; None = max_loras, vLLM's default)
    max_cpu_loras: int | None = None
    #: the adapters' rank (vLLM ``--max-lora-rank`` set to it): their size on every linear layer
    lora_rank: int = 16
    #: one adapter's size in MiB, when known (None: from lora_rank and the model's shapes)
    lora_adapter_mib: float | None = None
    #: storage -> host memory bandwidth, GB/s, for an adapter not in the host cache (an NVMe read and
    #: safetensors parse; an assumption, set it from a measurement)
    lora_fetch_gb_s: float = 2.0
    #: green knobs (sim/cost.py ``set_clock``): the GPUs' SM clock as a fraction of their maximum
    #: (``nvidia-smi -lgc``; compute-bound work slows in proportion, memory-bound decode much less,
    #: dynamic power falls as clock ** the catalog's ``clock_power_exponent``) ...
    gpu_clock: float = 1.0
    #: ... and a board power limit per GPU in watts (``nvidia-smi -pl``; None = the GPU's ``max_w``): a
    #: step that would draw more runs at the clock that keeps it under. A controller may change both
    #: at run time (sim/green.py)
    power_cap_w: float | None = None
    #: the pools of replicas, resolved. Given as tables of POOL_FIELDS plus ``name`` and ``role`` (unset
    #: fields take the values above); none given = one pool "default" of the fields above
    pools: tuple[PoolConfig, ...] = ()
    #: prefill -> decode KV transfer link (disaggregation): bandwidth per prefill replica and latency
    kv_link_gb_s: float = 50.0
    kv_link_latency_ms: float = 1.0
    #: scheduled replica failures: ``{"target": "r1", "at_s": 60, "down_s": 30}``
    failures: tuple[Scheduled, ...] = ()
    #: scheduled slowdowns (a throttled or degraded GPU, a noisy neighbour): ``{"target": "r1", "at_s": 60,
    #: "factor": 2.0, "for_s": 30}``: from at_s (for for_s seconds, or to the end) every step of the
    #: replica takes ``factor`` times as long, at the same power (docs/simulator.md)
    slowdowns: tuple[Scheduled, ...] = ()
    #: random failures: mean time between failures per replica (None = none) and mean time to repair
    mtbf_s: float | None = None
    mttr_s: float = 60.0
    #: what happens to requests on a failed replica: re-sent through the router, or reported as errors
    on_failure: str = "retry"
    #: autoscaling: {"policy": "concurrency" or package.module:Class, "interval_s", "cold_start_s", "args"}
    autoscale: Mapping[str, object] | None = None
    #: green controller (sim/green.py): {"policy": "slo_slack" or package.module:Class, "interval_s", "args"};
    #: sets each pool's gpu_clock at run time from the measured latency against its SLO; None = fixed clocks
    green: Mapping[str, object] | None = None
    #: MoE expert-load imbalance and EPLB (sim/moe.py): {"popularity": "zipf", "zipf_s": 1.0,
    #: "eplb_interval_s": 0, "redundant_experts": 0, "drift_s": 0, ...}; None = experts evenly loaded
    moe: Mapping[str, object] | None = None
    #: engine-level order of admission and preemption: "fcfs", "priority" (vLLM's), or package.module:Class
    scheduler: str = "fcfs"
    scheduler_args: Mapping[str, object] = dataclasses.field(default_factory=dict)
    #: seconds between two scrapes of the replicas' waiting / running / KV-usage signals that routers
    #: read from the View (0 = fresh at every event); the router's own accounting is always exact
    signal_refresh_s: float = 0.0
    #: simulated seconds between two samples of series.parquet
    series_interval_s: float = 1.0
    #: ``token_times`` per request: "segments" = one segment per run of equal steps (exact token
    #: times, every inter-token gap); "summary" = one segment from the first to the last token
    #: (exact TTFT, TPOT and E2E, compact and fast; inter-token gaps become the request's mean)
    token_times: str = "segments"
    #: extra catalog TOML files (user-defined GPUs / models)
    catalogs: tuple[str, ...] = ()
    #: a measured engine profile for every pool (``llmlb calibrate``): given as a file path or its
    #: content, held as the content. Its step times, KV blocks and block size replace the roofline's, and
    #: its max_num_seqs, max_num_batched_tokens and max_model_len fill those left unset; prefix
    #: caching is on only if both say so (sim/profile.py)
    profile: ProfileDoc | None = None
    #: draw step-time jitter from the pools' profiles where they measured it (sim/jitter.py); false:
    #: every step is the profile's median step, as before profiles measured their spread
    jitter: bool = True
    #: speculative decoding for every pool that does not set its own (sim/speculative.py); None = off
    speculative: Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        # a check, not a rewrite: every field already holds its parsed value (see ``from_dict``)
        if not self.pools or not all(isinstance(p, PoolConfig) for p in self.pools):
            raise TypeError("ClusterConfig holds parsed settings: make one with ClusterConfig.build(**settings) "
                            "or ClusterConfig.from_dict(mapping)")

    @classmethod
    def build(cls, **settings: object) -> "ClusterConfig":
        """The cluster of these settings (ClusterConfig's fields; pools as tables of settings),
        parsed and checked like a cluster file: ``ClusterConfig.build(replicas=4, gpu="h100-sxm")``."""
        return cls.from_dict(settings)

    @classmethod
    def from_dict(cls, d: Mapping[str, object], where: str = "cluster") -> "ClusterConfig":
        """Parse and check settings (a cluster file's tables, command-line flags, a run.json's
        ``config.cluster``) once, into typed values: pools resolved into :class:`PoolConfig`,
        profiles into their content, ``autoscale`` / ``moe`` into their specs. Errors are one
        line naming the field."""
        check_fields(d, {f.name for f in dataclasses.fields(cls)}, where)
        check_types(d, _hints(), where)
        given: dict[str, object] = {**_DEFAULTS, **d}
        catalogs = tuple(str(c) for c in _array(given["catalogs"]))
        given["profile"] = resolve_profile(given["profile"])
        failures = [as_table(f, f"cluster.failures[{i}]", "each failure must be a table of target, at_s and down_s")
                    for i, f in enumerate(_array(given["failures"]))]
        slowdowns = [as_table(f, f"cluster.slowdowns[{i}]", "each slowdown must be a table of target, at_s, factor "
                              "and for_s") for i, f in enumerate(_array(given["slowdowns"]))]
        pools = _parse_pools(given, catalogs)
        # failures and slowdowns are checked to be Scheduled events by _check (which knows the replicas)
        cfg = construct(cls, {**given, "catalogs": catalogs, "pools": pools, "replicas": sum(p.replicas for p in pools),
                              "failures": tuple(dict(f) for f in failures),
                              "slowdowns": tuple(dict(f) for f in slowdowns),
                              "scheduler_args": dict(as_table(given["scheduler_args"], where)),
                              **{k: dict(as_table(given[k], where)) if given[k] is not None else None
                                 for k in ("autoscale", "green", "moe")}})
        cfg._check()
        return cfg

    def _check(self) -> None:
        """The cluster-wide checks, on the parsed values (``from_dict`` runs them once)."""
        for name in ("kv_link_gb_s", "series_interval_s", "mttr_s"):
            if not getattr(self, name) > 0:
                raise UserError(f"must be > 0, got {getattr(self, name)!r}", f"cluster.{name}")
        for name in ("kv_link_latency_ms", "signal_refresh_s"):
            if not getattr(self, name) >= 0:
                raise UserError(f"must be >= 0, got {getattr(self, name)!r}", f"cluster.{name}")
        if self.mtbf_s is not None and not self.mtbf_s > 0:
            raise UserError("must be > 0 (or unset)", "cluster.mtbf_s")
        if self.token_times not in TOKEN_TIMES:
            raise UserError(f"must be one of {', '.join(TOKEN_TIMES)}, got {self.token_times!r}", "cluster.token_times")
        if self.on_failure not in FAILURE_MODES:
            raise UserError(f"must be one of {', '.join(FAILURE_MODES)}, got {self.on_failure!r}", "cluster.on_failure")
        spec = self.autoscale_spec
        if spec is not None:
            pool = spec.args.get("pool")
            if pool is not None and (not isinstance(pool, str) or pool not in {p.name for p in self.pools}):
                raise UserError(f"unknown pool {pool!r}", "cluster.autoscale.args.pool")
        make_engine_scheduler(self.scheduler, self.scheduler_args)
        if self.green_spec is not None and any(p.profile is not None for p in self.pools):
            raise UserError("a green controller sets the clock, which a measured profile's step times cannot "
                            "follow; use the roofline (no profile)", "cluster.green")
        if self.moe is not None:
            self._check_moe()
        roles = {p.role for p in self.pools}
        if ("prefill" in roles) != ("decode" in roles):
            raise UserError("a disaggregated cluster needs both a prefill and a decode pool", "cluster.pools")
        if "mixed" in roles and "prefill" in roles:
            raise UserError("pools are either all mixed or split into prefill and decode", "cluster.pools")
        if "prefill" in roles and len({(p.model) for p in self.pools}) > 1:
            raise UserError("prefill and decode pools must serve the same model", "cluster.pools")
        for i, f in enumerate(self.failures):
            self._check_failure(i, f)
        for i, f in enumerate(self.slowdowns):
            self._check_slowdown(i, f)

    def _check_moe(self) -> None:
        spec = self.moe_spec
        assert spec is not None
        moe_pools = [p for p in self.pools if p.model_spec(self.catalogs).is_moe]
        if not moe_pools:
            raise UserError("no pool serves a MoE model (experts > 1); expert-load imbalance does not apply",
                            "cluster.moe")
        for p in moe_pools:
            check_layout(spec, p.model_spec(self.catalogs).experts, p.tp, f"cluster.moe (pool {p.name})")

    def _check_slowdown(self, i: int, f: Mapping[str, object]) -> None:
        where = f"cluster.slowdowns[{i}]"
        if set(f) - {"target", "at_s", "factor", "for_s"} or not {"target", "at_s", "factor"} <= set(f):
            raise UserError("a slowdown needs target, at_s and factor (and optionally for_s)", where)
        if f["target"] not in {f"r{k}" for k in range(self.replicas)}:
            raise UserError(f"unknown target {f['target']!r} (targets are r0..r{self.replicas - 1})", where)
        at, factor, for_s = f["at_s"], f["factor"], f.get("for_s", 1.0)
        if not (_real(at) and _real(factor) and _real(for_s)):
            raise UserError("at_s, factor and for_s must be numbers", where)
        if not (at >= 0 and factor > 0 and for_s > 0):
            raise UserError("at_s must be >= 0, factor > 0 and for_s > 0", where)

    def _check_failure(self, i: int, f: Mapping[str, object]) -> None:
        where = f"cluster.failures[{i}]"
        unknown = sorted(set(f) - {"target", "at_s", "down_s"})
        if unknown or not {"target", "at_s"} <= set(f):
            raise UserError("a failure needs target and at_s (and optionally down_s)", where)
        names = {f"r{k}" for k in range(self.replicas)}
        if f["target"] not in names:
            raise UserError(f"unknown target {f['target']!r} (targets are r0..r{self.replicas - 1})", where)
        at, down = f["at_s"], f.get("down_s", 1)
        if not (isinstance(at, (int, float)) and at >= 0 and isinstance(down, (int, float)) and down > 0):
            raise UserError("at_s must be >= 0 and down_s > 0", where)

    # parsed once, when ``from_dict`` checks the cluster (frozen dataclasses allow cached_property:
    # it writes the instance's __dict__); not fields, so equality, to_dict and run.json see only the settings
    @functools.cached_property
    def autoscale_spec(self) -> AutoscaleSpec | None:
        """``autoscale`` parsed (and validated) once."""
        return AutoscaleSpec.parse(self.autoscale) if self.autoscale is not None else None

    @functools.cached_property
    def green_spec(self) -> GreenSpec | None:
        """``green`` parsed (and validated) once."""
        return GreenSpec.parse(self.green) if self.green is not None else None

    @functools.cached_property
    def moe_spec(self) -> MoeSpec | None:
        """``moe`` parsed (and validated) once."""
        return MoeSpec.parse(self.moe) if self.moe is not None else None

    @property
    def disaggregated(self) -> bool:
        return any(p.role == "prefill" for p in self.pools)

    @property
    def gpu_spec(self) -> GPU:
        return load_catalog(self.catalogs).gpu(self.gpu)

    @property
    def model_spec(self) -> Model:
        return load_catalog(self.catalogs).model(self.model)

    def to_dict(self) -> dict[str, object]:
        """The settings as JSON-able data (run.json's ``config.cluster``); ``from_dict`` reads them back
        into an equal ClusterConfig. Pools are stored resolved, one table of every PoolConfig field each."""
        d: dict[str, object] = dataclasses.asdict(self)
        for k in ("catalogs", "pools", "failures", "slowdowns"):
            d[k] = list(_array(d[k]))
        return d

    def with_profile(self, profile: ProfileDoc | str | Path) -> "ClusterConfig":
        """The same cluster with every pool on the measured ``profile`` (a path or its content).
        Engine settings the cluster left unset (None) come from the profile; a cluster without
        pools of its own is rebuilt from its top-level fields so that they stay unset."""
        content = resolve_profile(profile, where="profile")
        pools = ([] if len(self.pools) == 1 and self.pools[0].name == "default"
                 else [{**dataclasses.asdict(p), "profile": content} for p in self.pools])
        return ClusterConfig.from_dict({**self.to_dict(), "profile": content, "pools": pools})


def _array(value: object) -> list[object] | tuple[object, ...]:
    """A setting :func:`check_types` has checked to be an array (a list, or a tuple when given in Python)."""
    assert isinstance(value, (list, tuple)), value
    return value


def _real(x: object) -> TypeGuard[float]:
    """A number that is not a boolean (TOML's and JSON's integers and floats)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _parse_pools(given: Mapping[str, object], catalogs: tuple[str, ...]) -> tuple[PoolConfig, ...]:
    """The pools of a cluster's settings, resolved: a pool's unset fields take the top-level
    values; no pools = one pool "default" of the top-level fields."""
    listed = bool(given["pools"])
    raw = list(_array(given["pools"])) if listed else [{"replicas": given["replicas"]}]
    names: set[str] = set()
    out = []
    for i, pool_given in enumerate(raw):
        where = f"cluster.pools[{i}]" if listed else "cluster"
        if not isinstance(pool_given, Mapping):
            raise UserError("each pool must be a table of settings", where)
        check_fields(pool_given, {*POOL_FIELDS, "name", "role"}, where)
        check_types(pool_given, {**_hints(), "name": str, "role": str}, where)
        # typed by check_types: the cluster's fields above, this pool's here
        values: dict[str, object] = {k: pool_given.get(k, given[k]) for k in POOL_FIELDS}
        profile = values["profile"] = resolve_profile(values["profile"], where=f"{where}.profile")
        if profile is not None:
            values.update(_profile_engine(values, EngineProfile.of(profile), f"{where}.profile"))
        if values["max_num_seqs"] is None or values["max_num_batched_tokens"] is None:
            cat = load_catalog(catalogs)
            tokens, seqs = vllm_batch_defaults(cat.gpu(str(values["gpu"]), f"{where}.gpu"))
            if not values["chunked_prefill"]:
                # vLLM without chunked prefill: a step must hold any prompt whole
                max_len = values["max_model_len"]
                tokens = max(max_len if isinstance(max_len, int) and max_len
                             else cat.model(str(values["model"]), f"{where}.model").max_context, seqs)
            values["max_num_seqs"] = values["max_num_seqs"] or seqs
            values["max_num_batched_tokens"] = values["max_num_batched_tokens"] or tokens
        name = str(pool_given.get("name", "default" if not listed else f"pool{i}"))
        role = pool_given.get("role", name if name in ("prefill", "decode") else "mixed")
        if role not in ROLES:
            raise UserError(f"role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
        if name in names:
            raise UserError(f"duplicate pool name {name!r}", f"{where}.name")
        names.add(name)
        pool = construct(PoolConfig, {"name": name, "role": role, **values})   # checked by _check_engine
        _check_engine(pool, where, catalogs)
        out.append(pool)
    return tuple(out)


@functools.cache
def _hints() -> dict[str, object]:
    """The types a cluster's settings must have: ClusterConfig's field types, except that a
    profile may be given as a file path (parsed, it is the file's content)."""
    return {**typing.get_type_hints(ClusterConfig), "profile": Mapping[str, object] | str | None}


#: every setting's default, from the dataclass
_DEFAULTS: dict[str, object] = {f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                                for f in dataclasses.fields(ClusterConfig)}


def load_cluster(path: str | Path, overrides: Mapping[str, object] | None = None) -> ClusterConfig:
    """A cluster from a TOML file of ClusterConfig fields (``[[pools]]``, ``[autoscale]``,
    ``[moe]`` ...), with ``overrides`` (e.g. command-line flags) replacing top-level fields.
    ``profile`` paths in the file are relative to the file's folder."""
    data = read_toml(path, "cluster file (.toml)")
    base = Path(path).parent
    if data.get("profile") is not None:
        data["profile"] = resolve_profile(data["profile"], base, f"{path}: profile")
    pools = data.get("pools")
    if isinstance(pools, list):
        data["pools"] = [{**p, "profile": resolve_profile(p["profile"], base, f"{path}: pools[{i}].profile")}
                         if isinstance(p, dict) and p.get("profile") is not None else p for i, p in enumerate(pools)]
    return ClusterConfig.from_dict({**data, **(overrides or {})}, where=str(path))


def _profile_engine(values: Mapping[str, object], prof: EngineProfile, where: str) -> dict[str, object]:
    """The engine settings a pool takes from its measured profile (see sim/profile.py)."""
    if values["preemption"] == "swap":
        raise UserError("a measured profile has no KV swap (vLLM v1 recomputes preempted requests); "
                        "leave preemption at \"recompute\"", where)
    out: dict[str, object] = {k: getattr(prof, k) if values[k] is None else values[k] for k in PROFILE_ENGINE_FIELDS}
    out["block_size"] = prof.block_size
    out["enable_prefix_caching"] = bool(values["enable_prefix_caching"]) and prof.enable_prefix_caching
    return out


def vllm_batch_defaults(gpu: GPU) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that vLLM v1 picks for an OpenAI-compatible server
    (vllm/engine/arg_utils.py, ``get_batch_defaults``): GPUs with at least 70 GiB other than the
    A100 (H100, H200, MI300X, B200) get 8192 and 1024; the others 2048 and 256 (a larger budget
    lowered A100 throughput, vLLM PR #17885)."""
    if gpu.memory_gib >= 70 and "a100" not in gpu.name:
        return 8192, 1024
    return 2048, 256


def _check_lora(p: PoolConfig, where: str) -> None:
    """LoRA settings as vLLM checks them (vllm/config/lora.py)."""
    for name in ("max_loras", "max_cpu_loras", "lora_rank"):
        v = getattr(p, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "max_loras" else 1)):
            raise UserError(f"must be an integer >= {0 if name == 'max_loras' else 1}, got {v!r}", f"{where}.{name}")
    if p.lora_rank not in VLLM_LORA_RANKS:
        raise UserError(f"vLLM takes a LoRA rank of {', '.join(map(str, VLLM_LORA_RANKS))}; got {p.lora_rank}",
                        f"{where}.lora_rank")
    if p.max_cpu_loras is not None and p.max_cpu_loras < p.max_loras:
        raise UserError(f"must be >= max_loras ({p.max_loras}), as vLLM requires", f"{where}.max_cpu_loras")
    for name in ("lora_adapter_mib", "lora_fetch_gb_s"):
        v = getattr(p, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
            raise UserError(f"must be a number > 0, got {v!r}", f"{where}.{name}")
    if p.max_loras and p.preemption == "swap":
        raise UserError("LoRA adapters are modelled on vLLM v1, which has no KV swap; leave preemption at "
                        "\"recompute\"", f"{where}.max_loras")


def _check_green(p: PoolConfig, gpu: GPU, where: str) -> None:
    """The green knobs: a clock fraction in (0, 1], a power limit above the GPU's idle power;
    a measured profile has no compute/memory split for them to act on."""
    if isinstance(p.gpu_clock, bool) or not isinstance(p.gpu_clock, (int, float)) or not 0 < p.gpu_clock <= 1:
        raise UserError(f"must be a fraction of the maximum SM clock in (0, 1], got {p.gpu_clock!r}",
                        f"{where}.gpu_clock")
    cap = p.power_cap_w
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > gpu.idle_w):
        raise UserError(f"must be watts above the GPU's idle power ({gpu.idle_w:g} W), got {cap!r}",
                        f"{where}.power_cap_w")
    if p.profile is not None and (p.gpu_clock != 1 or cap is not None):
        raise UserError("a measured profile's step times have no compute/memory split for the clock or a power "
                        "cap to act on; use the roofline (no profile) for green knobs", f"{where}.gpu_clock")


def _check_engine(p: PoolConfig, where: str, catalogs: tuple[str, ...]) -> None:
    for name in ("replicas", "tp", "pp", "max_num_seqs", "max_num_batched_tokens", "block_size"):
        v = getattr(p, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"must be a positive integer, got {v!r}", f"{where}.{name}")
    if not 0 < p.gpu_memory_utilization <= 1:
        raise UserError(f"must be in (0, 1], got {p.gpu_memory_utilization!r}", f"{where}.gpu_memory_utilization")
    if p.max_num_batched_tokens < p.max_num_seqs:
        # vLLM refuses this too: every running request must be able to decode in one step.
        raise UserError(f"max_num_batched_tokens ({p.max_num_batched_tokens}) must be >= max_num_seqs "
                        f"({p.max_num_seqs})", f"{where}.max_num_batched_tokens")
    if p.max_model_len is not None and (not isinstance(p.max_model_len, int) or p.max_model_len < 2):
        raise UserError("must be an integer >= 2", f"{where}.max_model_len")
    if p.preemption not in PREEMPTION_MODES:
        raise UserError(f"must be one of {', '.join(PREEMPTION_MODES)}, got {p.preemption!r}", f"{where}.preemption")
    if isinstance(p.swap_space_gib, bool) or not isinstance(p.swap_space_gib, (int, float)) or p.swap_space_gib < 0:
        raise UserError(f"must be a number of GiB >= 0, got {p.swap_space_gib!r}", f"{where}.swap_space_gib")
    if p.preemption == "swap" and not p.swap_space_gib > 0:
        raise UserError("preemption = \"swap\" needs swap_space_gib > 0", f"{where}.swap_space_gib")
    _check_lora(p, where)
    cat = load_catalog(catalogs)
    gpu = cat.gpu(p.gpu, f"{where}.gpu")
    _check_green(p, gpu, where)
    if p.speculative is not None:
        spec = SpeculativeSpec.parse(p.speculative, f"{where}.speculative")
        if spec.draft_model is not None:
            cat.model(spec.draft_model, f"{where}.speculative.draft_model")
    layers = cat.model(p.model, f"{where}.model").layers
    if p.pp > layers:
        raise UserError(f"{p.model} has {layers} layers, fewer than pp = {p.pp} stages", f"{where}.pp")
