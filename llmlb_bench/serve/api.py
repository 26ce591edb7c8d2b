"""The OpenAI-compatible API of ``llmlb serve``: requests in, SSE and JSON out.

Endpoints (as vLLM serves them): ``POST /v1/completions`` and
``POST /v1/chat/completions`` (streaming or not), ``POST /tokenize``
(vLLM's ``{"prompt": ...}`` or ``{"messages": [...]}``, llama.cpp's
``{"content": ...}``; answers ``{"count", "max_model_len", "tokens"}``),
``GET /v1/models``, ``GET /health``, ``GET /metrics``, ``GET /version``.

A completion's prompt is a string, one string in a list, or a list of token
ids; a chat's prompt is its messages' contents, a newline between messages,
without a chat template, so the replayer's prompts count exactly their trace
length (see :mod:`llmlb_bench.serve.tokenizer`; images and audio count as in
:mod:`llmlb_bench.serve.media`). Honoured parameters: ``max_tokens``
(chat: also ``max_completion_tokens``; default: the rest of the model
length, as vLLM), ``min_tokens``, ``ignore_eos`` (see
:mod:`llmlb_bench.serve.outputs`), ``stream``,
``stream_options.include_usage``, ``user`` (tenant for fair schedulers and
policies), vLLM's ``priority``, and ``vllm_xargs.reasoning_tokens`` (what
the replayer sends for a trace row with reasoning, see docs/replay.md): the
first that many tokens of a chat stream come as vLLM's ``reasoning`` deltas,
the rest as ``content``, as vLLM's ``--reasoning-parser`` streams them (a
whole chat reply carries ``message.reasoning``); the engine's work does not
change, reasoning being decode steps like the answer's. Streams send one chunk per token at the
simulated token time, the last with its ``finish_reason``, then a usage
chunk (with ``prompt_tokens_details.cached_tokens``) when asked, then
``[DONE]``. Errors use OpenAI's ``{"error": {...}}`` body with vLLM's
statuses: 400 for invalid requests and prompts longer than the model, 404
for an unknown model, 429 when the routing policy refuses a request.
"""

from __future__ import annotations

import json
import random
import time
from typing import Callable, Mapping

from llmlb_bench import __version__
from llmlb_bench.replay.prompts import WORDS
from llmlb_bench.policies.lora import salted
from llmlb_bench.serve.http import Exchange
from llmlb_bench.backend_header import BACKEND_HEADER
from llmlb_bench.serve.live import LiveFleet, LiveRequest, Submission
from llmlb_bench.serve.media import MediaError, part_ids
from llmlb_bench.serve.metrics import render
from llmlb_bench.serve.outputs import OutputRule, prompt_key
from llmlb_bench.serve.tokenizer import VOCAB_SIZE, block_hashes, encode
from llmlb_bench.workload.reasoning import REASONING_ARG

#: each word's text as a JSON string (with its leading space)
_WORD_JSON = [json.dumps(" " + w).encode() for w in WORDS]
_DONE = b"data: [DONE]\n\n"
#: a request's JSON body, a JSON object whose values are narrowed where they are read
Body = Mapping[str, object]


class ApiError(Exception):
    """An invalid request: answered with ``status`` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        kind = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
                429: "RateLimitError"}.get(self.status, "Error")
        return json.dumps({"error": {"message": self.message, "type": kind, "param": self.param,
                                     "code": self.status}}).encode()


def _int(body: Body, name: str, low: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ApiError(400, f"{name} must be an integer >= {low}, got {v!r}", name)
    return v


def _bool(body: Body, name: str) -> bool:
    v = body.get(name, False)
    if not isinstance(v, bool):
        raise ApiError(400, f"{name} must be true or false, got {v!r}", name)
    return v


def prompt_ids(body: Body, chat: bool) -> list[int]:
    """Token ids of a completion's ``prompt`` or a chat's ``messages``."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", "messages")
        return messages_ids(messages)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        if any(not 0 <= i < VOCAB_SIZE for i in prompt):
            raise ApiError(400, f"token ids must be in [0, {VOCAB_SIZE})", "prompt")
        return list(prompt)
    raise ApiError(400, "prompt must be a string, one string in a list, or a list of token ids", "prompt")


def messages_ids(messages: list[object]) -> list[int]:
    """A chat prompt's token ids: each message's parts in order (text tokenised, images and audio
    counted as in :mod:`llmlb_bench.serve.media`), a newline token between messages; no template."""
    ids: list[int] = []
    newline = encode("\n")
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ApiError(400, "each message must be an object with role and content", "messages")
        if k:
            ids += newline
        content = m.get("content")
        if isinstance(content, str):
            ids += encode(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    raise ApiError(400, "each content part must be an object with a type", "messages")
                if part.get("type") == "text" and isinstance(part.get("text"), str):
                    ids += encode(part["text"])
                else:
                    try:
                        ids += part_ids(part)
                    except MediaError as err:
                        raise ApiError(400, str(err), "messages") from None
        elif content is not None:
            raise ApiError(400, "message content must be a string or a list of parts", "messages")
    return ids


class Responder:
    """Writes one completion's response as the engine reports it (the engine's ``Client``)."""

    __slots__ = ("ex", "chat", "stream", "usage", "model", "rng", "backend", "head", "tail", "created", "started",
                 "reasoning", "thinking_head")

    def __init__(self, ex: Exchange, chat: bool, stream: bool, usage: bool, model: str, rng: random.Random,
                 backend: Callable[[LiveRequest], str], reasoning: int = 0) -> None:
        self.ex = ex
        self.backend = backend
        self.chat = chat
        self.stream = stream
        self.usage = usage
        self.model = model
        self.rng = rng
        self.created = int(time.time())
        self.head = self.tail = self.thinking_head = b""
        self.started = False
        #: the first this many tokens are reasoning (chat only: completions apply no reasoning parser)
        self.reasoning = reasoning if chat else 0

    def _identity(self, live: LiveRequest) -> list[tuple[str, str]]:
        """``X-Llmlb-Backend`` (which backend served it, see :meth:`Api.backend`) and the
        client's ``X-Request-Id`` echoed: a replay through any router that passes backend headers
        on learns each request's backend from these."""
        out = [(BACKEND_HEADER, self.backend(live))]
        rid = self.ex.request.headers.get("x-request-id")
        return out + [("X-Request-Id", rid)] if rid else out

    def _id(self, live: LiveRequest) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{live.seq}"

    def _prefix(self, live: LiveRequest) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return (f'data: {{"id":"{self._id(live)}","object":"{kind}","created":{self.created},'
                f'"model":{json.dumps(self.model)},"choices":').encode()

    def on_start(self, live: LiveRequest) -> None:
        if not self.stream:
            return
        self.ex.start_stream(headers=[("Cache-Control", "no-cache")] + self._identity(live))
        self.head = self._prefix(live) + (b'[{"index":0,"delta":{"content":' if self.chat else b'[{"index":0,"text":')
        self.thinking_head = self._prefix(live) + b'[{"index":0,"delta":{"reasoning":'
        self.tail = (b'},"logprobs":null,"finish_reason":null}]}\n\n' if self.chat
                     else b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n')

    def _chunks(self, live: LiveRequest, count: int, reason: str | None) -> list[bytes]:
        out: list[bytes] = []
        if self.chat and not self.started:
            out.append(self._prefix(live) + b'[{"index":0,"delta":{"role":"assistant","content":""},'
                                            b'"logprobs":null,"finish_reason":null}]}\n\n')
        self.started = True
        rng, word = self.rng, OutputRule.next_word
        head, tail = self.head, self.tail
        body = count - 1 if reason else count
        thinking = min(body, self.reasoning - live.emitted) if self.reasoning > live.emitted else 0
        for _ in range(thinking):
            out.append(self.thinking_head + _WORD_JSON[word(rng)] + tail)
        for _ in range(body - thinking):
            out.append(head + _WORD_JSON[word(rng)] + tail)
        if reason:
            last = tail.replace(b'"finish_reason":null', f'"finish_reason":"{reason}"'.encode())
            final = self.thinking_head if live.emitted + count <= self.reasoning else head
            out.append(final + (_WORD_JSON[word(rng)] if count else b'""') + last)
        return out

    def on_tokens(self, live: LiveRequest, count: int) -> None:
        self.ex.send(b"".join(self._chunks(live, count, None)))

    def on_finish(self, live: LiveRequest, count: int) -> None:
        sub = live.sub
        made = live.emitted + count
        usage = {"prompt_tokens": sub.prompt_tokens, "total_tokens": sub.prompt_tokens + made,
                 "completion_tokens": made, "prompt_tokens_details": {"cached_tokens": live.cached_tokens}}
        if not self.stream:
            self._whole(live, made, usage)
            return
        out = self._chunks(live, count, sub.finish_reason)
        if self.usage:
            out.append(self._prefix(live) + b"[],\"usage\":" + json.dumps(usage).encode() + b"}\n\n")
        out.append(_DONE)
        self.ex.end(b"".join(out))

    def _whole(self, live: LiveRequest, made: int, usage: dict[str, object]) -> None:
        words = [" " + WORDS[OutputRule.next_word(self.rng)] for _ in range(made)]
        text = "".join(words)
        reason = live.sub.finish_reason
        if self.chat:
            message: dict[str, str | None] = {"role": "assistant", "content": text}
            if self.reasoning:
                message = {"role": "assistant", "reasoning": "".join(words[:self.reasoning]),
                           "content": "".join(words[self.reasoning:]) or None}
            choice = {"index": 0, "message": message, "logprobs": None,
                      "finish_reason": reason, "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
        body = {"id": self._id(live), "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": usage}
        self.ex.reply(200, json.dumps(body).encode(), headers=self._identity(live))

    def on_reject(self, live: LiveRequest, message: str) -> None:
        self.ex.reply(429, ApiError(429, message).body())


class Api:
    """The request handler of one port: ``target`` is its replica, or None for the routed port."""

    def __init__(self, fleet: LiveFleet, target: int | None, model: str, rule: OutputRule,
                 adapters: tuple[str, ...] = ()) -> None:
        self.fleet = fleet
        self.target = target
        self.model = model
        #: LoRA adapters served besides the base model (requests name them as ``model``)
        self.adapters = frozenset(adapters)
        self._listed = (model,) + tuple(a for a in adapters if a != model)
        self.rule = rule
        self.created = int(time.time())
        self._indices = range(len(fleet.replicas)) if target is None else range(target, target + 1)
        self._url: str | None = None

    def backend(self, live: LiveRequest) -> str:
        """This backend's identity: the URL this port listens on (what a router calls the worker;
        unique across ``llmlb serve`` processes), with ``#`` and the replica's name behind the routed
        ``--port``. Read from the socket once, on the first request."""
        if self.target is None:
            return f"{self._url}#{self.fleet.replicas[live.target].name}"
        return self._url  # type: ignore[return-value]

    def __call__(self, ex: Exchange) -> None:
        req = ex.request
        if self._url is None:
            self._url = _listen_url(ex)
        path, method = req.path, req.method
        routes = {"/v1/completions": "POST", "/v1/chat/completions": "POST", "/tokenize": "POST",
                  "/v1/models": "GET", "/health": "GET", "/metrics": "GET", "/version": "GET"}
        want = routes.get(path.rstrip("/") or "/")
        if want is None:
            ex.reply(404, b'{"detail":"Not Found"}')
            return
        if method != want:
            ex.reply(405, ApiError(405, f"{path} takes {want}, not {method}").body())
            return
        try:
            if method == "POST":
                body = _json_body(req.body)
                if path.startswith("/v1/"):
                    self.complete(ex, body, chat="chat" in path)
                else:
                    self.tokenize(ex, body)
            elif path == "/metrics":
                ex.reply(200, render(self.fleet, self._indices, self.model).encode(),
                         content_type="text/plain; version=0.0.4; charset=utf-8")
            elif path == "/v1/models":
                # as vLLM lists them: an adapter has the base model as its parent
                ex.reply(200, json.dumps({"object": "list", "data": [{
                    "id": m, "object": "model", "created": self.created, "owned_by": "llmlb-bench",
                    "root": m, "parent": None if m == self.model else self.model,
                    "max_model_len": self.fleet.max_model_len} for m in self._listed]}).encode())
            elif path == "/version":
                ex.reply(200, json.dumps({"version": __version__, "server": "llmlb serve"}).encode())
            else:
                ex.reply(200, b"", content_type="text/plain")
        except ApiError as err:
            ex.reply(err.status, err.body())

    def tokenize(self, ex: Exchange, body: Body) -> None:
        messages = body.get("messages")
        if isinstance(messages, list):
            ids = messages_ids(messages)
        else:
            text = body.get("prompt", body.get("content"))
            if not isinstance(text, str):
                raise ApiError(400, "give prompt (or content) as a string, or messages", "prompt")
            ids = encode(text)
        ex.reply(200, json.dumps({"count": len(ids), "max_model_len": self.fleet.max_model_len,
                                  "tokens": ids}).encode())

    def complete(self, ex: Exchange, body: Body, chat: bool) -> None:
        model = body.get("model")
        if model is not None and model != self.model and model not in self.adapters:
            raise ApiError(404, f"The model `{model}` does not exist.", "model")
        adapter = model if isinstance(model, str) and model in self.adapters and model != self.model else None
        if body.get("n", 1) != 1:
            raise ApiError(400, "only n = 1 is supported", "n")
        ids = prompt_ids(body, chat)
        prompt = len(ids)
        if prompt == 0:
            raise ApiError(400, "the prompt is empty", "messages" if chat else "prompt")
        fleet = self.fleet
        limit = fleet.max_model_len
        max_tokens = _int(body, "max_completion_tokens", 1) if chat else None
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens", 1)
        if max_tokens is None:
            max_tokens = limit - prompt
            if max_tokens < 1:
                raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, your "
                                    f"prompt has {prompt} tokens, which leaves no room for the completion.",
                               "messages" if chat else "prompt")
        elif prompt + max_tokens > limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the "
                                f"completion). Please reduce the length of the messages or completion.",
                           "max_tokens")
        min_tokens = _int(body, "min_tokens", 0) or 0
        if min_tokens > max_tokens:
            raise ApiError(400, f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})", "min_tokens")
        ignore_eos = _bool(body, "ignore_eos")
        stream = _bool(body, "stream")
        options = body.get("stream_options")
        if options is not None and not stream:
            raise ApiError(400, "Stream options can only be defined when `stream=True`.", "stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        rng = self.rule.rng(prompt_key(ids))
        out, reason = self.rule.length(rng, max_tokens, min_tokens, ignore_eos)
        if prompt + out > fleet.max_total:
            raise ApiError(400, f"prompt ({prompt}) + output ({out}) tokens exceed the {fleet.max_total - 1} "
                                f"tokens a replica can hold (its KV cache)", "max_tokens")
        user = body.get("user")
        tenant = user if isinstance(user, str) else "default"
        priority = _int(body, "priority", -(1 << 31)) or 0
        sub = Submission(prompt_tokens=prompt, output_tokens=out,
                         hashes=salted(block_hashes(ids, fleet.block_size), adapter),
                         stream=stream, target=self.target, tenant=tenant, priority=priority,
                         max_tokens=max_tokens, finish_reason=reason, adapter=adapter)
        live = fleet.submit(sub, Responder(ex, chat, stream, usage, adapter or self.model, rng, self.backend,
                                               _reasoning(body)),
                            ex.request.received)
        if not live.done:
            ex.on_lost = lambda: fleet.cancel(live)


def _reasoning(body: Body) -> int:
    """``vllm_xargs.reasoning_tokens``: how many of the output tokens to stream as reasoning."""
    xargs = body.get("vllm_xargs")
    if xargs is None:
        return 0
    if not isinstance(xargs, dict):
        raise ApiError(400, "vllm_xargs must be an object", "vllm_xargs")
    return _int(xargs, REASONING_ARG, 0) or 0


def _listen_url(ex: Exchange) -> str:
    """``http://host:port`` of the socket the exchange came in on."""
    transport = ex.conn.transport
    host, port = transport.get_extra_info("sockname")[:2] if transport is not None else ("unknown", 0)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _json_body(raw: bytes) -> dict[str, object]:
    try:
        body = json.loads(raw)
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body
