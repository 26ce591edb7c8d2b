"""The run summary: the shape of run.json's ``summary``, whatever backend wrote it.

A run's store is opened before its backend runs, and each backend fills its own sections: the
simulator its figures (``sim_time_s`` ... ``seed``, the feature sections where the fleet has the
feature) and ``sim_core``; the replayer ``client`` and ``replay`` (and ``energy`` with power
readings); ``llmlb route`` ``route``; an imported run ``import``; any run whose trace has prefix
hashes ``prefix_cache``. WHY one declared shape and not one per backend: run.json is one
document, read back by the same views and figures whatever wrote it, so every key is optional at
the top (``total=False``: which ones are there depends on the backend, and an old run.json may
lack any). Inside a section, what its writer always writes is required.

Sections another module computes with a shape of its own (the replayer's server check, power
domains, a peer tool's reported figures) keep that module's type.
"""

from __future__ import annotations

from typing import TypedDict


class SwapSummary(TypedDict):
    """KV swap totals of the replicas that swap (sim/kv_blocks.py)."""

    swap_outs: int
    swap_ins: int
    recompute_fallbacks: int
    transfer_s: float
    swap_blocks: dict[str, int]


class LoraSummary(TypedDict):
    """LoRA totals of the replicas that serve adapters (sim/lora.py)."""

    loads: dict[str, int]
    fetches: dict[str, int]
    load_time_s: float
    reserved_kv_blocks: dict[str, int]


class ReplicaCounts(TypedDict):
    initial: int
    added: int
    retired: int


class ExpertLoadSummary(TypedDict):
    """A MoE pool's large-batch slowdown: ``[time, value]`` from each change on, and its time-weighted mean."""

    slowdown_history: list[list[float]]
    mean_slowdown: float


class ClockSummary(TypedDict):
    """The green controller's SM clocks per pool (sim/green.py)."""

    clock_changes: int
    mean_clock: dict[str, float]
    final_clock: dict[str, float]


class LagFigures(TypedDict):
    """Milliseconds the client sent later than scheduled; None without a send."""

    p50: float | None
    p99: float | None
    max: float | None


# ---- the replayer's checks and measurements (replay/): declared here, below the replayer, so that
# run.json's shape resolves without importing it ----

class WorstPrompt(TypedDict):
    """The prompt whose count was furthest from its trace length."""

    request_id: int
    input_tokens: int
    counted: int


class LengthCheck(TypedDict):
    """Whole prompts counted before a run (replay/lengths.py ``check_lengths``): how many, how many exactly right, the worst."""

    checked: int
    exact: int
    worst: WorstPrompt | None


class DomainReadings(TypedDict):
    """How a domain's power was read (replay/power.py ``PowerSampler.describe``)."""

    source: str
    readings: int
    failed_readings: int


class _ReadingsOf(TypedDict, total=False):
    source: str
    readings: int
    failed_readings: int


class DomainEnergy(_ReadingsOf):
    """One domain's energy (``attribute``); with its :class:`DomainReadings` once the run has them."""

    endpoints: list[str]
    energy_j: float
    attributed_j: float
    idle_j: float
    span_s: float


class EnergySummary(TypedDict):
    """The energy of a replay (replay/power.py ``join_energy``)."""

    energy_j: float
    attributed_j: float
    idle_j: float
    domains: dict[str, DomainEnergy]
    rule: str


class ClientFigures(TypedDict):
    """The client timed against the no-op server's own clock (ms where it says so)."""

    requests: int
    ok: int
    trace_rate_rps: float | None
    send_rate_rps: float | None
    send_lateness_ms: LagFigures
    ttft_inflation_ms: LagFigures


class SelfCheck(ClientFigures):
    """run.json ``summary.client.self_check``: the figures, over how many seconds of the trace, and whether the
    client was late beyond the threshold."""

    seconds: float
    dispatch_lag_ms: LagFigures
    flagged: bool


class _ServerCompared(TypedDict, total=False):
    """Where the server's count was read at least twice: sent against received, and how far behind it was."""

    sent: int
    received: int
    lag_s: float
    behind_at_s: float | None


class EndpointCheck(_ServerCompared):
    """One endpoint's part of :class:`ServerCheck`."""

    readings: int
    unreadable: int
    available: bool


class ServerCheck(TypedDict):
    """run.json ``summary.client.server_check`` (replay/witness.py ``server_check``)."""

    lag_limit_s: float
    endpoints: dict[str, EndpointCheck]
    available: bool
    lag_s: float | None
    flagged: bool


class EnergySection(EnergySummary):
    """run.json ``summary.energy``: the replay's energy and the sampling interval it was read at."""

    interval_s: float


class ClientNotes(TypedDict, total=False):
    """What is added to ``client`` after the run: the self-check on a no-op server, the server's own
    record of what it received (replay/witness.py), the clock and offsets of Ray actors."""

    self_check: SelfCheck
    server_check: ServerCheck
    ray_workers: list[dict[str, object]]   # one record per actor: rows, place, clock offsets, error


class ClientSummary(ClientNotes):
    """The replay client's own figures (replay/client.py): was the client the bottleneck?"""

    event_loop: str
    workers: int
    clock: str
    t0_clock_s: float
    dispatch_lag_ms: LagFigures
    lag_threshold_ms: float
    flagged: bool
    cpu_s: float
    cpu_ms_per_request: float | None


class Resumed(TypedDict):
    carried_rows: int


class _ReplayOptional(TypedDict, total=False):
    multimodal_dropped: int      # one process only (the workers' merge does not count it)
    resumed: Resumed             # a --resume run: rows carried over from the partial run


class ReplaySummary(_ReplayOptional):
    """The replay's totals (replay/client.py's replay_summary, by one process or merged from its workers)."""

    statuses: dict[str, int]
    sent: int
    send_rate_rps: float | None          # the achieved send rate (None: fewer than two sends)
    duration_s: float | None             # from the first send to the last end
    interrupted: bool
    endpoints: list[str]
    models: list[str]
    notes: list[str]
    scraped_metrics: list[str]
    prompt_lengths: str
    prompt_length_check: LengthCheck | None


class RouteSummary(TypedDict):
    """``llmlb route``'s totals (proxy.py)."""

    backends: list[str]
    statuses: dict[str, int]
    requests: int


#: an imported peer result (peer_results/common.py); ``import`` is a keyword, hence the functional form
ImportSummary = TypedDict("ImportSummary", {"tool": str, "clock": str, "duration_s": float | None,
                                            "reported": dict[str, object], "notes": list[str]})


class PrefixCacheFile(TypedDict):
    """Where the cache accounting was written and each caching target's unit (metrics/cache_accounting.py)."""

    file: str
    unit_tokens: dict[str, int]


#: run.json's ``summary``; see the module docstring
RunSummary = TypedDict("RunSummary", {
    # ---- the simulator (sim/simulation.py) ----
    "sim_time_s": float,
    "wall_s": float,
    "requests": int,
    "status": dict[str, int],
    "events": int,
    "steps": int,
    "preemptions": int,
    "prefill_tokens": int,
    "swap": SwapSummary,                 # replicas with swap space
    "lora": LoraSummary,                 # replicas that serve adapters
    "retries": int,
    "failures": int,
    "kv_blocks": dict[str, int],
    "prefix_cache_hit_rate": float | None,
    "prefix_cache_units": dict[str, int],  # tokens per cached unit of each caching replica
    "energy_j": float,
    "attributed_energy_j": float,
    "gpu_hours": float,
    "cost_usd": float,
    "replicas": ReplicaCounts,
    "mean_utilization": float | None,
    "seed": int,
    "expert_load": dict[str, ExpertLoadSummary],  # MoE pools with skewed experts
    "green": ClockSummary,               # a clock controller
    "sim_core": str,                     # compiled or pure Python, and why (compiled_core.py)
    # ---- the replayer (replay/) ----
    "client": ClientSummary,
    "replay": ReplaySummary,
    "energy": EnergySection,             # measured power joined to the requests (replay/power.py)
    # ---- llmlb route, imports, any run with prefix hashes ----
    "route": RouteSummary,
    "import": ImportSummary,
    "prefix_cache": PrefixCacheFile,
}, total=False)
