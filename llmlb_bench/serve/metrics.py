"""Prometheus ``/metrics`` for ``llmlb serve``, under vLLM's metric names.

Routers and dashboards built for vLLM read the same series from a simulated
replica. Names, types and histogram buckets follow vLLM v1
(``vllm/v1/metrics/loggers.py``): the scheduler gauges
``vllm:num_requests_running`` / ``vllm:num_requests_waiting``, KV use as
``vllm:kv_cache_usage_perc`` (and its older name ``vllm:gpu_cache_usage_perc``),
``vllm:cache_config_info`` with the KV block count, counters of prompt and
generated tokens, preemptions, prefix-cache queries and hits (in tokens) and
finished requests by reason, and histograms of TTFT
(``vllm:time_to_first_token_seconds``), inter-token latency (under both its
old name ``vllm:time_per_output_token_seconds`` and its new one
``vllm:inter_token_latency_seconds``), per-request TPOT
(``vllm:request_time_per_output_token_seconds``), end-to-end latency and
prompt / generation lengths. Every sample carries ``model_name`` and
``engine`` labels.

All times are simulated seconds (what the simulated GPU took; with
``--speed`` 1 they equal wall seconds). Token counters include the tokens
of requests still in flight; histograms and the other counters are updated
when a request ends. One port in front of several replicas publishes their
sums (KV use: blocks in use over blocks in all of them), so a scraper sees
one engine, as behind a real load balancer.

The text is written by prometheus_client (``generate_latest`` over a
collector that yields this render's metric families), so the exposition
format is the reference implementation's; the counts behind it are kept
here, since they are summed over replicas at render time and ITL is observed
with weights (one observation per run of equal gaps).

``llmlb:token_lateness_seconds`` is not vLLM's: the self-check of the
timing. For every wake-up of a replica that wrote tokens, it observes the
wall seconds from the simulated time those tokens were due to the end of
the wake-up's last write (an upper bound for each chunk it wrote).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from llmlb_bench.serve.live import LiveFleet, LiveRequest

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
LATENESS_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)
FINISH_REASONS = ("stop", "length", "abort")


def length_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 series up to the model length (``build_1_2_5_buckets``)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class Histogram:
    """Prometheus histogram: per-bucket counts (le semantics), sum and count; weighted observations."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)   # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, weight: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += weight
        self.sum += value * weight
        self.count += weight

    def merge(self, other: "Histogram") -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.sum += other.sum
        self.count += other.count


class EngineMetrics:
    """What one replica has finished; see the module docstring."""

    def __init__(self, max_model_len: int = 131072) -> None:
        lengths = length_buckets(max_model_len)
        self.histograms = {
            "vllm:time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
            "vllm:time_per_output_token_seconds": Histogram(ITL_BUCKETS),
            "vllm:request_time_per_output_token_seconds": Histogram(ITL_BUCKETS),
            "vllm:e2e_request_latency_seconds": Histogram(LATENCY_BUCKETS),
            "vllm:request_prompt_tokens": Histogram(lengths),
            "vllm:request_generation_tokens": Histogram(lengths),
        }
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.aborted = 0
        self.prompt_tokens = 0          # of finished requests (in-flight ones are added when rendering)
        self.generation_tokens = 0
        self.cache_queries = 0
        self.cache_hits = 0

    def observe(self, live: "LiveRequest", made: int) -> None:
        """A request finished with ``made`` tokens (at the times of ``live.segments``)."""
        segs = live.segments
        h = self.histograms
        sub = live.sub
        self.success[sub.finish_reason] += 1
        self.prompt_tokens += sub.prompt_tokens
        self.generation_tokens += made
        self.cache_queries += sub.prompt_tokens
        self.cache_hits += live.cached_tokens
        h["vllm:request_prompt_tokens"].observe(sub.prompt_tokens)
        h["vllm:request_generation_tokens"].observe(made)
        if not segs:
            return
        first, last = live.first_token_s, live.last_token_s
        h["vllm:time_to_first_token_seconds"].observe(first - live.arrival_s)
        h["vllm:e2e_request_latency_seconds"].observe(last - live.arrival_s)
        if made > 1:
            h["vllm:request_time_per_output_token_seconds"].observe((last - first) / (made - 1))
        itl = h["vllm:time_per_output_token_seconds"]
        prev = None
        for start, gap, count in segs:
            if prev is not None:
                itl.observe(start - prev)
            if count > 1:
                itl.observe(gap, count - 1)
            prev = start + (count - 1) * gap


def render(fleet: "LiveFleet", indices: Iterable[int], model: str) -> str:
    """The Prometheus text exposition (format 0.0.4) of replicas ``indices``, summed."""
    idx = list(indices)
    reps = [fleet.replicas[i] for i in idx]
    t = fleet.read_now()
    total = EngineMetrics(fleet.max_model_len)
    for i in idx:
        m = fleet.states[i].metrics
        for name, hist in m.histograms.items():
            total.histograms[name].merge(hist)
        for reason, n in m.success.items():
            total.success[reason] += n
        total.success["abort"] += m.aborted
        total.prompt_tokens += m.prompt_tokens
        total.generation_tokens += m.generation_tokens
        total.cache_queries += m.cache_queries
        total.cache_hits += m.cache_hits
        prompt, made = fleet.in_flight_tokens(i, t)
        total.prompt_tokens += prompt
        total.generation_tokens += made
    blocks = sum(r.kv.total for r in reps)
    usage = sum(r.blocks_used_at(t) for r in reps) / blocks   # exact inside a decode run too
    names, values = ["model_name", "engine"], [model, str(idx[0]) if len(idx) == 1 else "all"]
    out: list[Metric] = []

    def metric(name: str, kind: str, help_text: str, value: float, extra: dict[str, str] | None = None) -> None:
        fam = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(
            name, help_text, labels=names + list(extra or {}))
        fam.add_metric(values + list((extra or {}).values()), value)
        out.append(fam)

    metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
           sum(len(r.running) for r in reps))
    metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
           sum(len(r.waiting) for r in reps) + (len(fleet.held) if len(idx) > 1 else 0))
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage)
    metric("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.", usage)
    bs = reps[0].bs
    metric("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", 1,
           {"block_size": str(bs), "num_gpu_blocks": str(blocks)})
    lora = reps[0].lora if len(reps) == 1 else None
    if lora is not None:   # one engine's adapters, as vLLM publishes them (value: when they were read)
        metric("vllm:lora_requests_info", "gauge", "Running stats on lora requests.", time.time(),
               {"max_lora": str(lora.max_loras), "running_lora_adapters": ",".join(sorted(lora.running)),
                "waiting_lora_adapters": ",".join(sorted(lora.waiting))})
    metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", total.prompt_tokens)
    metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
           total.generation_tokens)
    metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
           sum(r.preemptions for r in reps))
    metric("vllm:prefix_cache_queries_total", "counter",
           "Prefix cache queries, in terms of number of queried tokens.", total.cache_queries)
    metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
           total.cache_hits)
    success = CounterMetricFamily("vllm:request_success_total", "Count of successfully processed requests.",
                                  labels=names + ["finished_reason"])
    for reason, n in total.success.items():
        success.add_metric(values + [reason], n)
    out.append(success)
    helps = {
        "vllm:time_to_first_token_seconds": "Histogram of time to first token in seconds.",
        "vllm:time_per_output_token_seconds": "Histogram of time per output token in seconds.",
        "vllm:request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
        "vllm:e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
        "vllm:request_prompt_tokens": "Number of prefill tokens processed.",
        "vllm:request_generation_tokens": "Number of generation tokens processed.",
    }
    for name, hist in total.histograms.items():
        out.append(_histogram(name, helps[name], hist, names, values))
    out.append(_histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                          total.histograms["vllm:time_per_output_token_seconds"], names, values))
    out.append(_histogram("llmlb:token_lateness_seconds",
                          "Per wake-up that wrote tokens: wall seconds from their due time to its last write.",
                          fleet.lateness, names, values))
    metric("llmlb:simulated_time_seconds", "gauge", "Simulated seconds since the server started.", t)
    metric("llmlb:speed", "gauge", "Simulated seconds per wall-clock second.", fleet.speed)
    metric("llmlb:requests_rejected_total", "counter", "Requests the routing policy refused.",
           fleet.rejected if len(idx) > 1 else 0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(out))
    return generate_latest(registry).decode()


class _Families(Collector):
    """One render's metric families, handed to prometheus_client's text writer."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _histogram(name: str, help_text: str, hist: Histogram, names: list[str], values: list[str]) -> Metric:
    fam = HistogramMetricFamily(name, help_text, labels=names)
    buckets: list[tuple[str, float]] = []
    acc = 0
    for bound, c in zip(hist.bounds, hist.counts):
        acc += c
        buckets.append((_num(bound), acc))
    buckets.append(("+Inf", hist.count))
    fam.add_metric(values, buckets, hist.sum)
    return fam


def _num(v: float) -> str:
    return repr(float(v)) if isinstance(v, float) else str(v)
