"""The shape of one run's figures (:func:`llmlb_bench.metrics.summary.summarize`): a run of the report
document, and what gates, sweeps and reproductions read.

WHY declared here and not left a plain dict: the report's renderers, the gate, the sweep's figures and
every reproduction's check read the same keys; a key renamed or dropped at the producer is now a type
error at each reader, not a ``None`` in a table. Every key is always present; a section a run has no
data for (``slo`` without an SLO, ``fairness`` with one tenant ...) is ``None``.

The figures of one distribution (``n``, ``mean``, the percentiles asked for, ``ci`` and, for plots,
``cdf``: :func:`llmlb_bench.metrics.distribution.describe`) and the sections other metric modules
compute (pacing, fairness, energy, state ...) keep the type of the function that makes them.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

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


class OverDuration(TypedDict):
    """The rates per second of the whole duration (vLLM ``bench serve``'s), beside the arrival window's."""

    request_throughput: float | None
    output_throughput: float | None
    goodput: float | None
    good_token_throughput: float | None


class SloFigures(TypedDict):
    """The run judged against the SLO."""

    spec: dict[str, Any]        # Slo.to_dict()
    good: int
    good_tokens: int
    attainment: float | None
    goodput: float | None
    good_token_throughput: float | None


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
    wait: dict[str, Any]
    ttft: dict[str, Any]
    tpot: dict[str, Any]
    itl: dict[str, Any]
    e2e: dict[str, Any]
    norm_latency: dict[str, Any]
    reasoning: dict[str, Any] | None
    slo: SloFigures | None                         # None when not judged against an SLO
    per_class: dict[str, dict[str, Any]] | None    # None for a run of one class and one tenant
    per_tenant: dict[str, dict[str, Any]] | None
    per_adapter: dict[str, dict[str, Any]] | None  # null adapter = the base model ("base")
    adapter_loads: dict[str, Any] | None           # None where no target loads adapters
    pacing: dict[str, Any] | None
    speculative: dict[str, Any] | None
    fairness: dict[str, Any] | None
    energy: dict[str, Any] | None
    state: dict[str, Any] | None
    conversations: dict[str, Any] | None           # None for a run without sessions
    prefix_cache: dict[str, Any] | None
    steady: dict[str, Any]
    control: dict[str, Any] | None                 # None for a run without a load step in its workload
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
    ttft: dict[str, Any]
    tpot: dict[str, Any]
    itl: dict[str, Any]
    e2e: dict[str, Any]


class LoadCurve(TypedDict):
    """Runs of one configuration at several offered rates (:func:`llmlb_bench.metrics.load.load_curves`)."""

    name: str
    points: list[CurvePoint]
    knee_figure: str
    knee_rate: float | None
    max_goodput: MaxGoodput | None
