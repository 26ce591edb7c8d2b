"""What each replayed request says: the HTTP request bytes of one trace row for one endpoint.

The prompt is materialised from the row's block hashes (prompts.py) at its input length, or, for a
dependent request of a conversation, extends its parent's prompt and the answer the server returned
(threads.py); images and audio (chat API only) take their token cost off the text. The output length
is asked for as ``max_tokens`` and, with ``force_output_length``, forced (vLLM's ``min_tokens`` and
``ignore_eos``; the reasoning split through ``vllm_xargs``, see docs/replay.md).
"""

from __future__ import annotations

import json

from llmlb_bench.replay.http import build_request
from llmlb_bench.replay.media import AUDIO_TOKENS_PER_S, image_side, png_data_url, wav_base64
from llmlb_bench.replay.options import ReplayOptions
from llmlb_bench.replay.preflight import Preflight
from llmlb_bench.replay.prompts import PromptBuilder
from llmlb_bench.replay.threads import Prompt, Threads
from llmlb_bench.trace_columns import TraceColumns
from llmlb_bench.workload.reasoning import REASONING_ARG

_API_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class Bodies:
    """Builds the request of each trace row (``tr``) for the preflighted endpoints (``pre``)."""

    def __init__(self, tr: TraceColumns, pre: Preflight, options: ReplayOptions, prompts: PromptBuilder,
                 threads: Threads | None, headers: str) -> None:
        self.tr = tr
        self.pre = pre
        self.options = options
        self.prompts = prompts
        self.threads = threads
        self.headers = headers
        self.path = _API_PATHS[options.api]
        #: requests whose images and audio were left out (only the chat API carries them)
        self.media_dropped = 0

    def request(self, idx: int, target: int) -> bytes:
        """Row ``idx``'s request to endpoint ``target`` (a dependent's prompt is noted in its thread)."""
        tr = self.tr
        images, audio_s = tr.images[idx], tr.audio_s[idx]
        media = bool(images or audio_s)
        if media and self.options.api != "chat":
            self.media_dropped += 1  # only the chat API carries images and audio
            media = False
        # input_tokens includes what the images and audio cost; the text gets the rest
        media_tokens = tr.image_tokens[idx] + round(audio_s * AUDIO_TOKENS_PER_S) if media else 0
        tokens = max(0, tr.inp[idx] - media_tokens)
        threaded = self.threads.prompt(idx, tokens, media) if self.threads is not None else None
        text = self.prompts.text(tokens, tr.hashes(idx), tr.rid[idx]) if threaded is None else ""
        out = max(1, tr.out[idx])
        # a LoRA adapter is served under its own name (vLLM's --lora-modules NAME=DIR)
        body: dict[str, object] = {"model": tr.adapter[idx] or self.pre.models[target]}
        if media:
            side = image_side(tr.image_tokens[idx] // images) if images else 0
            content: list[dict[str, object]] = [{"type": "text", "text": text}]
            content += [{"type": "image_url", "image_url": {"url": png_data_url(side, tr.rid[idx] * 64 + k)}}
                        for k in range(images)]
            if audio_s:
                content.append({"type": "input_audio",
                                "input_audio": {"data": wav_base64(audio_s, tr.rid[idx]), "format": "wav"}})
            body["messages"] = [{"role": "user", "content": content}]
        else:
            prompt: Prompt = threaded if threaded is not None else (
                [{"role": "user", "content": text}] if self.options.api == "chat" else text)
            body["messages" if self.options.api == "chat" else "prompt"] = prompt
            if self.threads is not None:
                self.threads.sent(idx, prompt)
        body.update(max_tokens=out, stream=True, stream_options={"include_usage": True})
        if self.options.force_output_length:
            body.update(min_tokens=out, ignore_eos=True)
            if tr.reasoning[idx] > 0:  # how the output splits, for engines that can be told (docs/replay.md)
                body["vllm_xargs"] = {REASONING_ARG: tr.reasoning[idx]}
        if self.options.extra_body:
            body.update(self.options.extra_body)
        return build_request("POST", self.pre.endpoints[target], self.path,
                             f"{self.headers}X-Request-Id: {tr.rid[idx]}\r\n",
                             json.dumps(body, separators=(",", ":")).encode())
