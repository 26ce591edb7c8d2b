"""What cluster to simulate: the replicas, their hardware and model, and the engine settings.

``ClusterConfig`` is a frozen, JSON-able record stored in every run's
run.json, so a simulated run can be reproduced from its results folder
alone (``ClusterConfig.from_dict(run_json["config"]["cluster"])``).
Defaults follow vLLM v1's defaults for online serving.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from llmlb_bench.errors import UserError
from llmlb_bench.sim.catalog import GPU, Model, load_catalog


@dataclass(frozen=True)
class ClusterConfig:
    """N identical replicas of one model served by one engine configuration.

    Every field has a default; unknown GPU or model names are a
    :class:`UserError` listing the known ones.
    """

    #: number of replicas (each replica is one engine instance on ``tp`` GPUs)
    replicas: int = 4
    gpu: str = "a100-80g"
    model: str = "llama-3-8b"
    #: tensor-parallel degree: GPUs per replica
    tp: int = 1
    #: vLLM ``max_num_seqs``: at most this many requests in the running batch
    max_num_seqs: int = 256
    #: vLLM ``max_num_batched_tokens``: token budget of one engine step
    max_num_batched_tokens: int = 8192
    #: KV-cache block size in tokens
    block_size: int = 16
    #: fraction of GPU memory the engine may use for weights, activations and KV cache
    gpu_memory_utilization: float = 0.9
    #: split long prefills across steps (vLLM v1 default); when off, a prompt waits for a step with room for all of it
    chunked_prefill: bool = True
    #: longest prompt + output a request may have; ``None`` = the model's context length
    max_model_len: int | None = None
    #: simulated seconds between two samples of series.parquet
    series_interval_s: float = 1.0
    #: extra catalog TOML files (user-defined GPUs / models)
    catalogs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "catalogs", tuple(str(c) for c in self.catalogs))
        for name in ("replicas", "tp", "max_num_seqs", "max_num_batched_tokens", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UserError(f"must be a positive integer, got {v!r}", f"cluster.{name}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UserError(f"must be in (0, 1], got {self.gpu_memory_utilization!r}", "cluster.gpu_memory_utilization")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses this too: every running request must be able to decode in one step.
            raise UserError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                            f"({self.max_num_seqs})", "cluster.max_num_batched_tokens")
        if self.series_interval_s <= 0:
            raise UserError("must be > 0", "cluster.series_interval_s")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise UserError("must be >= 2", "cluster.max_model_len")
        cat = load_catalog(self.catalogs)
        cat.gpu(self.gpu, "cluster.gpu")
        cat.model(self.model, "cluster.model")

    @property
    def gpu_spec(self) -> GPU:
        return load_catalog(self.catalogs).gpu(self.gpu)

    @property
    def model_spec(self) -> Model:
        return load_catalog(self.catalogs).model(self.model)

    @property
    def context_limit(self) -> int:
        return self.max_model_len if self.max_model_len is not None else self.model_spec.max_context

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["catalogs"] = list(self.catalogs)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "cluster") -> "ClusterConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"unknown cluster setting {unknown[0]!r} (known: {', '.join(sorted(known))})", where)
        kwargs = dict(d)
        if "catalogs" in kwargs:
            kwargs["catalogs"] = tuple(kwargs["catalogs"])
        return cls(**kwargs)
