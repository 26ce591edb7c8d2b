"""The shape of one run's figures (:func:`llmlb_bench.metrics.summary.summarize`): a run of the report
document, and what gates, sweeps and reproductions read.

WHY declared here and not left a plain dict: the report's renderers, the gate, the sweep's figures and
every reproduction's check read the same keys; a key renamed or dropped at the producer is now a type
error at each reader, not a ``None`` in a table. Every key is always present; a section a run has no
data for (``slo`` without an SLO, ``fairness`` with one tenant ...) is ``None``.

Every section other metric modules compute (pacing, speculative decoding, adapter loads, fairness,
energy, serving state, conversations, prefix-cache accounting, steady state, control, per-group figures,
the figures of one distribution) is declared here too and returned by its module, so the renderers can
name them without loading the metrics. Where a module builds keys from a tuple (the percentiles a caller
asks for, the cache buckets, the group percentiles) each key is a literal type (:data:`PercentileKey`,
:data:`GroupKey`, :data:`CacheBucket`), so mypy checks the key the module writes; the percentile keys
are total=False (a caller asks for some), and the report's shape checks (tests/shape_check.py) check
every key of what was written.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from llmlb_bench.metrics.slo import SloSpec
from llmlb_bench.run_summary import ClientSummary

#: a latency figure every report shows (:data:`llmlb_bench.metrics.definitions.LATENCY_FIGURES`)
LatencyName = Literal["ttft", "tpot", "itl", "e2e", "norm_latency"]
#: an answer figure of a run with reasoning (:data:`llmlb_bench.metrics.definitions.ANSWER_FIGURES`)
AnswerName = Literal["ttfa", "answer_tpot"]


class Reason(TypedDict):
    """One normalised reason of a run's not-ok requests of one status (metrics/failures.py)."""

    reason: str
    requests: int


class Failure(Reason):
    """Requests of a run that are not ok, by status and normalised reason (metrics/failures.py)."""

    status: str


#: a percentile's key in a distribution's figures (metrics/distribution.py's pkey)
PercentileKey = Literal["p50", "p90", "p95", "p99", "p99.9"]

#: the percentiles a distribution's figures can carry (metrics/distribution.py's PERCENTILES, and the
#: p50 and p99 of the wait), each the one the caller asked for, and its CDF where asked (for plots)
Percentiles = TypedDict("Percentiles", {"p50": float | None, "p90": float | None, "p95": float | None,
                                        "p99": float | None, "p99.9": float | None, "cdf": list[float] | None},
                        total=False)


class PointFigure(Percentiles):
    """A distribution's figures without its count, as a load curve's point carries them."""

    mean: float | None
    ci: dict[str, list[float]] | None


class Distribution(PointFigure):
    """The figures of one distribution (metrics/distribution.py's describe): count, mean, the percentiles
    asked for and, with intervals, each one's [low, high] (None without)."""

    n: int


class WaitFigures(TypedDict):
    """The ok requests' router wait or client lag (metrics/summary.py's _wait)."""

    n: int
    mean: float | None
    p50: float | None
    p99: float | None
    max: float | None
    share: float | None         # of the requests that waited at all (more than 1 us)
    kind: str                   # router | client | router+client (metrics/origin.py)
    included: bool              # whether the latency figures count it (their origin is the arrival)
    flagged: bool               # a replay whose client lag p99 exceeds its threshold


#: a group figure's key at a group percentile (metrics/latency.py's GROUP_KEYS)
GroupKey = Literal["ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99"]


class GroupLatency(TypedDict, total=False):
    """A group's TTFT and E2E percentiles (metrics/latency.py's GROUP_KEYS), each
    where the group has ok requests with that figure."""

    ttft_p50: float
    ttft_p99: float
    e2e_p50: float
    e2e_p99: float


class GroupFigures(GroupLatency):
    """One SLO class, tenant or LoRA adapter of a run (metrics/summary.py's _group)."""

    requests: int
    ok: int
    good: int | None                # None without an SLO
    good_tokens: int | None
    attainment: float | None
    service: int                    # weighted tokens (metrics/fairness.py)
    norm_latency_mean: float | None


class ReasoningFigures(TypedDict):
    """The reasoning share of a run's ok output and the answer's figures (time to first answer token, its
    TPOT), for a run with reasoning (metrics/summary.py's _reasoning)."""

    requests: int
    tokens: int
    share: float | None
    ttfa: Distribution
    answer_tpot: Distribution


class OverDuration(TypedDict):
    """The rates per second of the whole duration (vLLM ``bench serve``'s), beside the arrival window's."""

    request_throughput: float | None
    output_throughput: float | None
    goodput: float | None
    good_token_throughput: float | None


class SloFigures(TypedDict):
    """The run judged against the SLO."""

    spec: SloSpec
    good: int
    good_tokens: int
    attainment: float | None
    goodput: float | None
    good_token_throughput: float | None


#: the pacing of a run's requests against their TPOT and TTFT limits (metrics/pacing.py); the share's key
#: names pacing.FLUIDITY_LEVEL, as the report's table reads it
Fluidity = TypedDict("Fluidity", {"mean": float, "p1": float, "share_ge_0.9": float, "requests": int})


class StreamPacing(TypedDict):
    """The pacing figures of one run's token streams (metrics/pacing.py's pacing_of)."""

    requests: int
    fluidity: Fluidity | None               # None without a TPOT limit
    fluid_token_rate: float | None
    slowest10_gap_mean_s: float | None


class PacingFigures(StreamPacing):
    """A run's pacing figures, and whether its token rows were a block sample."""

    sampled: bool


class _Acceptance(TypedDict, total=False):
    """Speculative decoding's acceptance, where the server's series or the simulator counted drafts."""

    source: str                             # server | simulator
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float | None


class SpeculativeFigures(_Acceptance):
    """Tokens per delivery of a run's streams, and the acceptance where counted (metrics/speculative.py)."""

    tokens_per_delivery: float | None


class AdapterLoads(TypedDict):
    """LoRA adapter loads into GPU slots, in all and per target (metrics/adapters.py)."""

    total: int
    per_target: dict[str, int]


class TenantService(TypedDict):
    """One tenant's service (weighted tokens) and mean normalized latency (metrics/counts.py)."""

    requests: int
    service: int                # weighted tokens (fairness.INPUT_WEIGHT, OUTPUT_WEIGHT): whole numbers
    norm_latency_mean: float | None


class FairnessFigures(TypedDict):
    """How evenly a run with two or more tenants served them (metrics/fairness.py)."""

    tenants: int
    window_s: float
    windows: int
    service_gap_max: float | None
    service_gap_mean: float | None
    jain_service: float | None
    jain_attainment: float | None
    slowdown_ratio: float | None
    per_tenant: dict[str, TenantService]


class EnergyFigures(TypedDict):
    """A run's energy and cost per token (metrics/energy.py; its docstring defines each figure)."""

    energy_j: float | None
    energy_source: str | None               # series | requests (None: no energy recorded)
    attributed_energy_j: float | None       # the sum of requests.energy_j (idle power left out)
    j_per_output_token: float | None
    j_per_good_token: float | None
    avg_power_w: dict[str, float] | None    # per target
    avg_power_per_replica_w: float | None
    gpus: int | None
    price_per_hour: float | None
    price_source: str | None                # given | catalog
    cost_usd: float | None
    usd_per_m_output_tokens: float | None
    usd_per_m_good_tokens: float | None


class TargetState(TypedDict):
    """One target's KV pressure and queues over its series samples (metrics/state.py)."""

    samples: int
    kv_mean: float | None
    kv_max: float | None
    kv_high_share: float | None
    waiting_mean: float | None
    waiting_max: float | None
    running_mean: float | None
    running_max: float | None


class StateFigures(TypedDict):
    """The serving state behind a run's latency figures (metrics/state.py)."""

    prefix_cache_hit_rate: float | None
    preemptions: int | None
    preempted_requests: int | None
    kv_util_mean: float | None
    kv_util_max: float | None
    kv_high_share: float | None
    waiting_mean: float | None
    waiting_max: float | None
    running_mean: float | None
    running_max: float | None
    per_target: dict[str, TargetState] | None   # None without series
    client: ClientSummary | None                # run.json's summary.client (the replayer's runs)


class CompletionTimes(TypedDict):
    """Session completion time (s) over the sessions whose every request is ok."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


class SessionTokens(TypedDict):
    """Mean tokens of a session, summed over its requests."""

    input_mean: float | None
    output_mean: float | None
    cached_mean: float | None


class TurnTtft(TypedDict):
    """TTFT of the ok requests of one turn (the last row pools the later turns)."""

    turn: int
    pooled: bool
    requests: int
    p50: float | None
    p99: float | None


class ConversationFigures(TypedDict):
    """What a run's sessions experienced (metrics/conversations.py)."""

    sessions: int
    completed: int
    requests_mean: float
    attainment: float | None    # None without an SLO
    completion_s: CompletionTimes
    tokens: SessionTokens
    ttft_by_turn: list[TurnTtft]


class CacheBuckets(TypedDict):
    """Each prefix-cache accounting bucket (metrics/cache_accounting.py's BUCKETS) as a share of the run's
    prompt tokens (None: no prompt tokens)."""

    offered: float | None
    reachable: float | None
    achieved: float | None
    granularity: float | None
    failed: float | None
    routing: float | None
    in_flight: float | None
    eviction: float | None
    stale: float | None
    unmeasured: float | None
    beyond: float | None


class CacheTokens(TypedDict):
    """The run's prompt tokens and each bucket in tokens."""

    prompt: int
    offered: int | None
    reachable: int | None
    achieved: int | None
    granularity: int | None
    failed: int | None
    routing: int | None
    in_flight: int | None
    eviction: int | None
    stale: int | None
    unmeasured: int | None
    beyond: int | None


class PredictedHits(TypedDict):
    """The router's predicted prefix-cache hit rate against the delivered one, over ok requests it predicted."""

    requests: int
    hit_rate_predicted: float
    hit_rate_delivered: float
    over: float
    under: float


class PrefixCacheFigures(CacheBuckets):
    """A run's prefix-cache accounting (metrics/cache_accounting.py)."""

    tokens: CacheTokens
    predicted: PredictedHits | None     # None where the policy predicted no hits


class SteadyPart(TypedDict):
    """One tenth of a run's arrival window (metrics/steady.py)."""

    part: int
    ttft_mean: float | None
    attainment: float | None
    n: int


class SteadyFigures(TypedDict):
    """Whether a run reached steady state, and the sentences that say why not (metrics/steady.py)."""

    steady: bool
    flags: list[str]
    tail_s: float | None
    parts: list[SteadyPart]


#: a signal the control figures read (metrics/control.py's SIGNALS)
Signal = Literal["ttft", "queue", "replicas"]


class SpectralPeak(TypedDict):
    """The strongest non-zero frequency of a deviation and its share of the energy (None: too few samples)."""

    spectral_peak_hz: float | None
    spectral_peak_share: float | None


class StepResponse(SpectralPeak):
    """How one signal responded to one load step (metrics/control.py's step_response)."""

    at_s: float
    end_s: float
    initial: float
    final: float
    change: float
    settling_s: float
    settled: bool
    overshoot: float | None
    steady_state_error: float | None     # None without an SLO's TTFT limit (and for other signals)
    sign_changes: int


class SignalResponse(SpectralPeak):
    """One signal's figures over a run's load steps (metrics/control.py's combine)."""

    edges: int
    settling_s: float
    settled: bool
    overshoot: float | None
    steady_state_error: float | None
    sign_changes: int
    responses: list[StepResponse]


class ControlSignals(TypedDict, total=False):
    """The signals a run has data for (replicas only where the fleet's size changed)."""

    ttft: SignalResponse
    queue: SignalResponse
    replicas: SignalResponse


class ControlFigures(ControlSignals):
    """How a run's signals responded to the load steps of its workload (metrics/control.py)."""

    bin_s: float
    quantile: float
    threshold: float
    steps: list[float]


class RunFigures(TypedDict):
    """One run's figures; see the module docstring."""

    run_id: str
    label: str
    policy: str | None
    backend: str
    status: str
    created_utc: str
    requests: int
    # requests by status (schema.STATUSES)
    ok: int
    error: int
    timeout: int
    rejected: int
    not_sent: int
    failures: list[Failure]            # not-ok requests by status and reason, most first
    duration_s: float
    window_s: float
    offered_rate: float | None
    realised_rate: float | None
    request_throughput: float | None
    output_throughput: float | None
    input_throughput: float | None
    over_duration: OverDuration
    input_tokens: int
    output_tokens: int
    cached_tokens: int | None
    preemptions: int | None
    definitions: str
    facets: dict[str, str | None]
    latency_from: str
    wait: WaitFigures
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    norm_latency: Distribution
    reasoning: ReasoningFigures | None             # None for a run without reasoning
    slo: SloFigures | None                         # None when not judged against an SLO
    per_class: dict[str, GroupFigures] | None      # None for a run of one class and one tenant
    per_tenant: dict[str, GroupFigures] | None
    per_adapter: dict[str, GroupFigures] | None    # null adapter = the base model ("base")
    adapter_loads: AdapterLoads | None             # None where no target loads adapters
    pacing: PacingFigures | None
    speculative: SpeculativeFigures | None
    fairness: FairnessFigures | None
    energy: EnergyFigures | None
    state: StateFigures | None
    conversations: ConversationFigures | None      # None for a run without sessions
    prefix_cache: PrefixCacheFigures | None
    steady: SteadyFigures
    control: ControlFigures | None                 # None for a run without a load step in its workload
    name: str                                      # the facets that set it apart in this set of runs


#: a latency figure a load curve's points carry (with its interval)
PointLatency = Literal["ttft", "tpot", "itl", "e2e"]


class MaxGoodput(TypedDict):
    """DistServe's maximum goodput over a curve's runs: the highest offered rate whose attainment reaches
    the target (:func:`llmlb_bench.metrics.goodput.max_goodput`)."""

    rate: float
    attainment: float
    goodput: float | None
    good_token_throughput: float | None
    run_id: str
    gpus: float | None
    rate_per_gpu: float | None
    target: float


class CurvePoint(TypedDict):
    """One run of a load curve: its offered and realised rate, throughput, SLO figures and latency figures
    (each as its run's figures have it, without the count)."""

    run_id: str
    rate: float
    realised_rate: float | None
    throughput: float | None
    output_throughput: float | None
    goodput: float | None
    attainment: float | None
    ttft: PointFigure
    tpot: PointFigure
    itl: PointFigure
    e2e: PointFigure


class LoadCurve(TypedDict):
    """Runs of one configuration at several offered rates (:func:`llmlb_bench.metrics.load.load_curves`)."""

    name: str
    points: list[CurvePoint]
    knee_figure: str
    knee_rate: float | None
    max_goodput: MaxGoodput | None
