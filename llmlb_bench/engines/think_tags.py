"""A vLLM logits processor that makes a random-weight model "reason" for a chosen number of tokens.

Why it exists: vLLM's reasoning parser (``--reasoning-parser deepseek_r1``) splits a stream into
``reasoning`` and ``content`` deltas at the ``</think>`` token, but the tiny random model
(:mod:`llmlb_bench.engines.tiny_hf`) never emits it by itself. With this processor a request
that carries ``vllm_xargs: {"reasoning_tokens": R}`` (what the replayer sends for a trace row
with reasoning, :data:`llmlb_bench.workload.reasoning.REASONING_ARG`) gets ``</think>`` forced
as its output token number R + 1 and both tags kept out everywhere else, so its stream is
exactly R reasoning chunks, the tag (which vLLM does not stream), then the answer. It also keeps
every other special token and every token that is not whole printable ASCII text out of the output
(a lone byte of a multi-byte character streams as an empty delta, which no client can count), so
each output token streams as exactly one non-empty chunk. That makes
replay's reasoning accounting testable against a real engine (tests/test_reasoning_vllm.py).
A request without the argument reasons for 0 tokens (``</think>`` first): the deepseek_r1
parser takes everything before ``</think>`` as reasoning, as DeepSeek-R1 opens its reasoning
in the prompt, so without the tag a whole answer would stream as reasoning.
``VllmSettings(reasoning=True)`` loads it.

It runs inside vLLM's own virtualenv (imported by module path, with the project on
``PYTHONPATH``), so it imports only vLLM, torch and the standard library, never the rest of
llmlb_bench.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

#: the same name as llmlb_bench.workload.reasoning.REASONING_ARG (not imported: see the docstring)
ARG = "reasoning_tokens"
START, END = "<think>", "</think>"


#: characters of whole printable-ASCII byte-level tokens: "!".."~" as themselves, and "Ġ" (a space)
_PLAIN = frozenset(chr(c) for c in range(33, 127)) | {"\u0120"}


def read_vocab(model_dir: str | Path) -> tuple[int, int, list[int]]:
    """From the model's byte-level ``tokenizer.json``: the ids of ``<think>`` and ``</think>``, and of
    the tokens that decode on their own to printable ASCII text."""
    tok = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    plain = [i for text, i in tok["model"]["vocab"].items() if text not in added and set(text) <= _PLAIN]
    return added[START], added[END], plain


class ForceThinkEnd(AdapterLogitsProcessor):
    """Per request with ``reasoning_tokens`` = R: ``</think>`` at output position R (0-based), no tag elsewhere."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        self.start, self.end, plain = read_vocab(vllm_config.model_config.tokenizer)
        #: -inf on every token an output may not hold (all but plain text), 0 elsewhere
        self.banned = torch.full((vllm_config.model_config.get_vocab_size(),), float("-inf"))
        self.banned[plain] = 0.0

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token wins

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        value = (params.extra_args or {}).get(ARG)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(f"vllm_xargs.{ARG} must be an integer >= 0, got {value!r}")

    def new_req_logits_processor(self, params: SamplingParams) -> Any:    # Any: a callable vLLM's API takes
        reasoning = (params.extra_args or {}).get(ARG) or 0
        end, banned = self.end, self.banned

        def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
            if len(output_ids) == reasoning:
                logits.fill_(float("-inf"))
                logits[end] = 0.0
                return logits
            return logits.add_(banned.to(logits.device, logits.dtype))

        return force
