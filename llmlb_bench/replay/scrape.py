"""Load signals scraped from the engines' Prometheus ``/metrics``.

A real router sees more than its own in-flight count: engines publish how
many requests wait and run and how full their KV cache is. The replayer
reads these every ``scrape_s`` seconds, puts them in the policies' view
(with the time they were read, so policies can judge staleness) and in
series.parquet. Metric names per engine (gauges, summed over label sets):

=========  ===============================  ==============================  =============================================
engine     waiting                          running                         KV cache use (0..1)
=========  ===============================  ==============================  =============================================
vLLM       ``vllm:num_requests_waiting``    ``vllm:num_requests_running``   ``vllm:kv_cache_usage_perc`` (V1 engine),
                                                                            ``vllm:gpu_cache_usage_perc`` (V0, removed)
SGLang     ``sglang:num_queue_reqs``        ``sglang:num_running_reqs``     ``sglang:token_usage``
llama.cpp  ``llamacpp:requests_deferred``   ``llamacpp:requests_processing`` ``llamacpp:kv_cache_usage_ratio``
TGI        ``tgi_queue_size``               ``tgi_batch_current_size``      -
=========  ===============================  ==============================  =============================================

vLLM's ``vllm:cache_config_info{num_gpu_blocks="N"}`` gives the KV block
count, so series rows also get ``kv_blocks_used``/``kv_blocks_total``. Its
counter ``vllm:num_preemptions_total`` becomes the series column
``preemptions``: the increase since the target's previous scrape (see
:func:`counter_delta`), so a run shows when the engine preempted, and the
count from before the run never enters it. Speculative decoding's counters
(vLLM V1's ``vllm:spec_decode_num_drafts_total``, ``_num_draft_tokens_total``
and ``_num_accepted_tokens_total``) become ``spec_drafts``,
``spec_draft_tokens`` and ``spec_accepted_tokens`` the same way: verify
steps that drafted, tokens drafted, drafted tokens the target accepted.

vLLM started with ``--enable-lora`` publishes its adapters only as
``vllm:lora_requests_info{max_lora, running_lora_adapters,
waiting_lora_adapters}``: the adapters (comma-separated names) of the
requests in the running batch and in the waiting queue, as labels of a gauge
whose value is the time it was last set. Old label sets stay exposed, so the
current one is the series with the largest value (an
:class:`~llmlb_bench.policies.lora.AdapterSnapshot` in the view's ``adapters``, read by
LoRA-affinity routing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from prometheus_client.parser import text_string_to_metric_families

from llmlb_bench.policies.base import View, put
from llmlb_bench.policies.lora import AdapterSnapshot

_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred", "tgi_queue_size")
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing",
            "tgi_batch_current_size")
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio")
#: series column -> engine counter, for the counters kept as increases per scrape
COUNTERS = {"preemptions": "vllm:num_preemptions_total",
            "spec_drafts": "vllm:spec_decode_num_drafts_total",
            "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
            "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total"}
_LORA = "vllm:lora_requests_info"


def _adapter_names(label: str) -> frozenset[str]:
    return frozenset(a for a in (x.strip() for x in label.split(",")) if a)


@dataclass
class Signals:
    """One scrape of one endpoint; ``None`` where the engine publishes no such metric."""

    waiting: int | None = None
    running: int | None = None
    kv_usage: float | None = None
    kv_blocks_total: int | None = None
    #: vLLM's LoRA adapters (None: the engine serves none, or publishes nothing about them)
    lora: AdapterSnapshot | None = None
    #: every counter of ``COUNTERS`` the engine publishes, by series column: totals since it
    #: started (compare two scrapes)
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def preemptions_total(self) -> float | None:
        return self.counters.get("preemptions")

    def known(self) -> bool:
        return self.waiting is not None or self.running is not None or self.kv_usage is not None


def metric_lines(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """``(sample name, labels, value)`` of each sample of Prometheus text exposition, parsed by
    prometheus_client. A malformed line (an engine's bug) costs only that line: the text is then
    parsed again line by line, skipping the lines that do not parse."""
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except ValueError:
        samples = []
        for line in text.splitlines():
            if line and line[0] != "#":
                try:
                    samples.extend(s for family in text_string_to_metric_families(line) for s in family.samples)
                except ValueError:
                    continue
    for sample in samples:
        yield sample.name, sample.labels, sample.value


def parse_metrics(text: str) -> Signals:
    """Read the known gauges from Prometheus text exposition (other lines are ignored)."""
    sums: dict[str, float] = {}
    blocks = None
    lora: tuple[float, AdapterSnapshot] | None = None
    for name, labels, value in metric_lines(text):
        if name == "vllm:cache_config_info" and "num_gpu_blocks" in labels:
            raw = labels["num_gpu_blocks"]
            blocks = int(raw) if raw.isdigit() else None
            continue
        if name == _LORA and labels.get("max_lora", "").isdigit() and (lora is None or value > lora[0]):
            lora = (value, AdapterSnapshot(int(labels["max_lora"]), _adapter_names(labels.get("running_lora_adapters", "")),
                                    _adapter_names(labels.get("waiting_lora_adapters", ""))))
            continue
        if name in _WAITING or name in _RUNNING or name in _KV or name in _COUNTER_NAMES:
            sums[name] = sums.get(name, 0.0) + value

    def first(names: tuple[str, ...]) -> float | None:
        return next((sums[n] for n in names if n in sums), None)

    waiting, running, kv = first(_WAITING), first(_RUNNING), first(_KV)
    return Signals(waiting=None if waiting is None else int(waiting), running=None if running is None else int(running),
                   kv_usage=kv, kv_blocks_total=blocks, lora=lora[1] if lora is not None else None,
                   counters={col: sums[name] for col, name in COUNTERS.items() if name in sums})


_COUNTER_NAMES = frozenset(COUNTERS.values())


def counter_delta(previous: float | None, current: float | None) -> int | None:
    """The increase of a Prometheus counter between two scrapes; None without both readings.
    A counter that went down was reset (the engine restarted): its new value is the increase."""
    if previous is None or current is None:
        return None
    return int(round(current - previous if current >= previous else current))


def update_view(view: View, i: int, sig: Signals, now: float) -> None:
    """Put one scrape of target ``i`` into the policies' view (a metric the engine does not
    publish keeps the view's own value) and stamp it with the time it was read."""
    if sig.waiting is not None:
        put(view, "waiting", i, sig.waiting)
    if sig.running is not None:
        put(view, "running", i, sig.running)
    if sig.kv_usage is not None:
        put(view, "kv_usage", i, sig.kv_usage)
    if sig.lora is not None:
        put(view, "adapters", i, sig.lora)
    put(view, "signal_time", i, now)


class SeriesRows:
    """Scrapes as series.parquet rows (columns of the SERIES schema), one per answered scrape.

    The one place that turns a scrape into a row, for every scraper (the replayer, ``llmlb
    route``, the router bench): KV blocks used from the 0..1 fraction and the block count, and
    each counter (``COUNTERS``: preemptions, speculative decoding) as the increase since the same
    target's previous scrape."""

    COLUMNS = ("t_s", "target", "waiting", "running", "kv_blocks_used", "kv_blocks_total", *COUNTERS)

    def __init__(self) -> None:
        self._previous: dict[str, dict[str, float]] = {}
        #: ``t_s`` of each row, then the other columns
        self._times: list[float] = []
        self._rows: dict[str, list[object]] = {k: [] for k in self.COLUMNS[1:]}

    def add(self, t_s: float, target: str, sig: Signals) -> None:
        total = sig.kv_blocks_total
        used = round(sig.kv_usage * total) if total is not None and sig.kv_usage is not None else None
        previous = self._previous.get(target, {})
        row = (target, sig.waiting, sig.running, used, total,
               *(counter_delta(previous.get(col), sig.counters.get(col)) for col in COUNTERS))
        self._times.append(t_s)
        for k, v in zip(self.COLUMNS[1:], row):
            self._rows[k].append(v)
        self._previous[target] = sig.counters

    def take(self, origin: float = 0.0) -> dict[str, list[object]] | None:
        """The rows added since the last call (None when there are none), times counted from ``origin``
        (a scraper that reads a clock of its own), then start afresh."""
        if not self._times:
            return None
        times, self._times = self._times, []
        rows, self._rows = self._rows, {k: [] for k in self.COLUMNS[1:]}
        return {"t_s": [t - origin for t in times], **rows}
