"""What a live endpoint says about its engine: model, model length, KV blocks, block size, slots.

Read before any probe, so a missing setting stops the command at once. Sources,
by engine (all optional; a flag always wins):

* ``/v1/models``: the model name and, from vLLM and ``llmlb serve``, ``max_model_len``;
* ``/metrics``: vLLM's ``vllm:cache_config_info`` labels (``block_size``,
  ``num_gpu_blocks``, ``enable_prefix_caching``) — ``llmlb serve`` publishes the same;
  llama.cpp's ``llamacpp:`` metrics only say that it is llama.cpp;
* llama.cpp's ``/props``: ``total_slots`` (its ``max_num_seqs``) and ``n_ctx``.

vLLM publishes neither ``max_num_seqs`` nor ``max_num_batched_tokens``: without
flags they are taken to be vLLM's OpenAI-server defaults for GPUs below 70 GiB
(256 and 2048; vllm/engine/arg_utils.py) and the profile lists them as assumed.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Mapping

from llmlb_bench.errors import UserError

#: vLLM's defaults for an OpenAI-compatible server (GPUs below 70 GiB, CPUs)
VLLM_DEFAULT_SEQS, VLLM_DEFAULT_TOKENS = 256, 2048
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class EngineInfo:
    """The engine settings a profile needs, and where each came from."""

    url: str
    kind: str                       # vllm, llmlb-serve, llama.cpp, unknown
    model: str
    settings: dict[str, int]        # ENGINE_INTS of sim/profile.py plus enable_prefix_caching (a bool)
    sources: dict[str, str] = field(default_factory=dict)   # setting -> flag, engine, assumed

    @property
    def assumed(self) -> list[str]:
        return sorted(k for k, v in self.sources.items() if v == "assumed")


def _get(url: str, timeout: float = 10.0) -> tuple[int, str] | None:
    """(status, body) of a GET, or None when the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, http.client.HTTPException, ValueError):
        return None


def metric_labels(text: str, name: str) -> dict[str, str] | None:
    """The labels of the first sample of metric ``name`` in Prometheus text, or None."""
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return dict(_LABEL.findall(line[len(name) + 1:line.rfind("}")]))
    return None


def _int(value: object) -> int | None:
    try:
        v = int(str(value))
    except ValueError:
        return None
    return v if v > 0 else None


def cache_block_size(url: str) -> int | None:
    """The KV block (tokens) the engine behind ``url`` caches prefixes in, from vLLM's
    ``vllm:cache_config_info`` (``llmlb serve`` publishes it too); 0 when it says prefix caching
    is off; None when it does not say."""
    got = _get(f"{url.rstrip('/').removesuffix('/v1')}/metrics", timeout=5.0)
    labels = metric_labels(got[1], "vllm:cache_config_info") if got and got[0] == 200 else None
    if labels and labels.get("enable_prefix_caching") == "False":
        return 0
    return _int(labels.get("block_size")) if labels else None


def discover(url: str, given: Mapping[str, int | None], model: str | None = None) -> EngineInfo:
    """The endpoint's engine settings: ``given`` (flags; None = not given) over what the engine
    publishes over assumed vLLM defaults. One-line errors for an endpoint that does not answer
    and for settings that nothing gives."""
    base = url.rstrip("/").removesuffix("/v1")
    got = _get(f"{base}/v1/models")
    if got is None:
        raise UserError("no answer from the endpoint (is it running? is the URL right?)", url)
    status, body = got
    try:
        cards = json.loads(body).get("data") or [] if status == 200 else []
    except (ValueError, AttributeError):
        cards = []
    if status == 200 and not cards and model:
        # transformers serve lists its hub cache, not the model it was started with
        cards = [{"id": model}]
    if status != 200 or not cards:
        raise UserError(f"GET /v1/models answered {status} without a model list: not an OpenAI-compatible "
                        "endpoint", url)
    card = next((c for c in cards if c.get("id") == model), None) if model else cards[0]
    if card is None:
        raise UserError(f"the endpoint serves no model {model!r} (it serves {', '.join(str(c.get('id')) for c in cards)})",
                        "--model")
    found: dict[str, int | None] = {"max_model_len": _int(card.get("max_model_len"))}
    metrics = _get(f"{base}/metrics")
    text = metrics[1] if metrics and metrics[0] == 200 else ""
    kind = "unknown"
    if "vllm:" in text:
        kind = "llmlb-serve" if "llmlb:speed" in text else "vllm"
        labels = metric_labels(text, "vllm:cache_config_info") or {}
        found["block_size"] = _int(labels.get("block_size"))
        found["num_kv_blocks"] = _int(labels.get("num_gpu_blocks"))
        if labels.get("enable_prefix_caching") in ("True", "False"):
            found["enable_prefix_caching"] = labels["enable_prefix_caching"] == "True"
    props = _get(f"{base}/props")
    if "llamacpp:" in text or (props and props[0] == 200 and "total_slots" in props[1]):
        kind = "llama.cpp"
        try:
            p = json.loads(props[1]) if props and props[0] == 200 else {}
        except ValueError:
            p = {}
        slots = _int(p.get("total_slots"))
        n_ctx = _int((p.get("default_generation_settings") or {}).get("n_ctx"))
        found["max_num_seqs"] = slots
        found["max_model_len"] = found["max_model_len"] or n_ctx
    settings: dict[str, int] = {}
    sources: dict[str, str] = {}
    defaults = {"max_num_seqs": VLLM_DEFAULT_SEQS, "max_num_batched_tokens": VLLM_DEFAULT_TOKENS,
                "enable_prefix_caching": True}
    flags = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-batched-tokens",
             "block_size": "--block-size", "num_kv_blocks": "--kv-blocks", "max_model_len": "--max-model-len",
             "enable_prefix_caching": "--prefix-caching"}
    for key, flag in flags.items():
        flagged, published = given.get(key), found.get(key)
        if flagged is not None:
            settings[key], sources[key] = flagged, "flag"
        elif published is not None:
            settings[key], sources[key] = published, "engine"
        elif key in defaults:
            settings[key], sources[key] = defaults[key], "assumed"
        else:
            raise UserError(f"the endpoint ({kind}) does not publish {key}; give {flag}", url)
    if settings["max_num_batched_tokens"] < settings["max_num_seqs"]:
        if sources["max_num_batched_tokens"] == "flag":
            # vLLM refuses this too: every running request must be able to decode in one step
            raise UserError(f"must be >= max_num_seqs ({settings['max_num_seqs']})", "--max-batched-tokens")
        settings["max_num_batched_tokens"] = settings["max_num_seqs"]   # the assumed default, raised as vLLM would
    return EngineInfo(url=base, kind=kind, model=str(card.get("id")), settings=settings, sources=sources)
