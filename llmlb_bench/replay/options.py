"""Settings of one replay, separate from the CLI so the API and tests share them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Literal, TypedDict

#: retried when ``retries`` > 0: overload and transient server failures
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class ReplayProgress(TypedDict):
    """The live counters a replay hands its ``progress`` callback (``Replayer.counters``)."""

    sent: int
    in_flight: int
    done: int
    errors: int
    total: int
    ttft_p50_ms: float | None


@dataclass
class Timeouts:
    """Seconds; ``None`` disables one. ``between_tokens`` is the longest silence after the
    first token; ``first_token`` counts from the moment the request was sent."""

    connect: float | None = 10.0
    first_token: float | None = 600.0
    between_tokens: float | None = 120.0
    total: float | None = None


@dataclass
class ReplayOptions:
    """How to turn trace rows into HTTP requests and when to send them."""

    api: Literal["chat", "completions"] = "chat"
    #: model name sent in every request; ``None``: each endpoint's first ``/v1/models`` entry
    model: str | None = None
    #: trace times are multiplied by this (0.5 = twice the request rate)
    time_scale: float = 1.0
    #: closed loop: this many users, each sending its next request when the last one ended
    #: (``None``: open loop at the trace's times)
    users: int | None = None
    #: closed loop: seconds a user waits between the end of a request and its next one
    think_s: float = 0.0
    #: client processes sharing the run (each sends a share of the trace, routes it with its own
    #: copy of the policy, and writes its rows; the parent merges them)
    workers: int = 1
    #: where the workers run: ``"process"`` (local processes) or ``"ray"`` (Ray actors spread over
    #: the nodes of a cluster, clocks measured and corrected; see replay.ray_workers)
    executor: Literal["process", "ray"] = "process"
    #: Ray cluster to connect to (``auto``, ``host:port``, ``ray://host:10001``); ``None``: a private
    #: local Ray instance, or the one this process has already started
    address: str | None = None
    #: send ``min_tokens`` and ``ignore_eos`` (vLLM, SGLang, llama.cpp) so outputs have the trace's length
    force_output_length: bool = True
    #: further fields merged into every request body, e.g. an engine's own sampling parameters
    #: (vLLM's ``allowed_token_ids``, ``top_k``)
    extra_body: dict[str, object] = field(default_factory=dict)
    #: a dependent request's prompt extends its parent's prompt and the answer the server returned
    #: (replay.threads); False: every prompt materialised from the trace's hashes
    thread: bool = True
    #: environment variable holding the API key, sent as a Bearer token and never stored;
    #: ``None``: ``OPENAI_API_KEY`` when it is set, else no key
    api_key_env: str | None = None
    #: measure per-word token costs with the first endpoint's tokenize endpoint for exact prompt lengths
    tokenize: bool = False
    #: a local ``tokenizer.json`` (or a folder holding one) for exact prompt lengths, read with the
    #: ``tokenizers`` package; no server endpoint needed
    tokenizer: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    #: further attempts for HTTP 429/5xx and connection failures before any response byte
    retries: int = 0
    #: first retry waits this long, doubling each time (a ``Retry-After`` header wins when larger)
    retry_backoff_s: float = 0.5
    #: seconds between scrapes of each endpoint's Prometheus ``/metrics`` (``None``: never)
    scrape_s: float | None = 1.0
    #: where power comes from (``nvml[:0,1]``, ``prometheus:URL``, ``constant:WATTS``): once for the
    #: fleet or once per endpoint; energy is then attributed to requests (see replay.power)
    power_sources: list[str] = field(default_factory=list)
    #: seconds between power readings
    power_interval_s: float = 1.0
    #: a run whose dispatch lag p99 exceeds this is flagged in run.json
    lag_threshold_ms: float = 5.0
    #: seconds between the start call and the first scheduled send (connections are set up meanwhile)
    start_delay_s: float = 0.05
    #: called about twice a second with live counters (sent, in_flight, done, errors, ttft_p50_ms)
    progress: Callable[[ReplayProgress], None] | None = None

    def describe(self) -> dict[str, object]:
        """The options as stored in run.json (no callables, no secrets: only the key's variable name)."""
        out: dict[str, object] = asdict(self)
        out.pop("progress")
        return out
