"""One trace request in flight: its timestamps, and how its HTTP response is read.

A :class:`Flight` is the handler of the connection that carries it
(:class:`llmlb_bench.replay.http.Handler`). It turns the response into what
the result row needs (first/last token times, one token segment per
received read, usage) and reports the outcome to its :class:`Outcomes`
owner (:class:`~llmlb_bench.replay.attempts.Attempts`), which decides about
retries and hands the final outcome to the run, which writes the row.

Token counting: a stream chunk whose ``choices[].text`` (completions) or
``choices[].delta.content`` / ``reasoning`` / ``reasoning_content`` (chat) is
non-empty counts as one token, or, when the server sends usage with every chunk
(vLLM's and SGLang's ``stream_options.continuous_usage_stats``, asked for
through ``ReplayOptions.extra_body``; seen on the first chunk with choices),
every chunk counts the rise of ``usage.completion_tokens`` since the previous
one (its text may be empty); all chunks decoded from one socket read share
that read's timestamp and form one segment. ``output_tokens`` comes from the
server's ``usage`` when it sends one, otherwise from that count (flagged as
estimated).

Reasoning: a chunk whose delta carries only ``reasoning`` (vLLM) or
``reasoning_content`` (DeepSeek, SGLang) is a reasoning token; the first
chunk with non-empty ``content`` is the first answer token, and its read's
time is ``first_answer_s``. ``reasoning_tokens`` is the server's
``usage.completion_tokens_details.reasoning_tokens`` when it sends a positive
one (a server that hides its reasoning still counts it), else the count of
reasoning chunks: vLLM 0.32 sends 0 there after streaming reasoning deltas. With usage in every
chunk (continuous_usage_stats) each reasoning chunk counts the tokens its usage rose by, so a delta
the server bundled (its API server behind the engine) still counts every token.
The think tags themselves, which vLLM does not stream, are in neither count. The answer test comes first, so a stream
without reasoning costs what it did.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Protocol

from llmlb_bench.policies import RouteRequest
from llmlb_bench.replay.http import Connection
from llmlb_bench.replay.sse import SSEDecoder
from llmlb_bench.backend_header import backend_from_headers

if TYPE_CHECKING:
    import asyncio

try:  # orjson is a core dependency where it has wheels (parsing is most of the per-token cost)
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads  # type: ignore[assignment]

_SSE, _JSON, _ERROR = 1, 2, 3
_MAX_BODY = 16 << 20
_MAX_ERROR_BODY = 4096


class Outcomes(Protocol):
    """What a flight reports to (implemented by replay.attempts.Attempts)."""

    def finished(self, f: "Flight", status: str, error: str | None, now: float) -> None: ...

    def failed_before_response(self, f: "Flight", reason: str, now: float) -> None: ...

    def first_token(self, f: "Flight", now: float) -> None: ...

    def refused(self, f: "Flight", http_status: int, error: str, retry_after: float | None,
                now: float) -> None: ...


class Flight:
    """State of one request from dispatch to its result row."""

    __slots__ = (
        "idx", "route", "target", "request", "scheduled_s", "owner",
        "sent", "attempt_start", "attempts", "reused", "fresh_used", "conn", "timer",
        "first", "last", "last_rx", "seg_start", "seg_count", "chunks",
        "usage_out", "usage_in", "cached", "http_status", "backend", "done", "answer",
        "reasoning", "answer_at", "usage_reasoning",
        "_mode", "_sse", "_parts", "_size", "_finish_seen", "_retry_after", "_chunk_usage",
    )

    def __init__(self, idx: int, route: RouteRequest, target: int, request: bytes,
                 scheduled_s: float, owner: Outcomes) -> None:
        self.idx = idx
        self.route = route
        self.target = target
        self.request = request
        self.scheduled_s = scheduled_s
        self.owner = owner
        self.sent: float | None = None
        self.attempts = 0
        #: the current attempt runs on a pooled connection; ``fresh_used``: its one fresh retry is spent
        self.reused = False
        self.fresh_used = False
        self.conn: Connection | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.done = False
        #: the answer's text pieces, kept only when a dependent request will extend it
        #: (replay.threads); None: not kept
        self.answer: list[str] | None = None
        self.reset_attempt()

    def reset_attempt(self) -> None:
        """Forget what an earlier attempt received (retries start clean)."""
        self.attempt_start = 0.0
        self.first: float | None = None
        self.last: float | None = None
        self.last_rx = 0.0
        self.seg_start: list[float] = []
        self.seg_count: list[int] = []
        self.chunks = 0
        #: reasoning chunks, and the time of the first answer chunk
        self.reasoning = 0
        self.answer_at: float | None = None
        self.usage_reasoning: int | None = None
        self.usage_out: int | None = None
        self.usage_in: int | None = None
        self.cached: int | None = None
        #: whether every text chunk carries usage (decided at the first one; None: not yet)
        self._chunk_usage: bool | None = None
        self.http_status: int | None = None
        #: the backend the response names (a router's decision), see backend_header
        self.backend: str | None = None
        self._mode = 0
        self._sse: SSEDecoder | None = None
        self._parts: list[bytes] = []
        self._size = 0
        self._finish_seen = False
        self._retry_after: float | None = None
        if self.answer is not None:
            self.answer = []

    # -- connection callbacks --------------------------------------------
    def on_head(self, status: int, headers: dict[str, str], now: float) -> None:
        self.http_status = status
        self.last_rx = now
        self.backend = backend_from_headers(headers)
        if 200 <= status < 300:
            ctype = headers.get("content-type", "").lower()
            if "text/event-stream" in ctype:
                self._mode, self._sse = _SSE, SSEDecoder()
            elif "json" in ctype:
                self._mode = _JSON  # the server ignored stream=true: one whole completion
            else:
                self._abort("error", f"unexpected content-type {ctype or 'none'!r} "
                                     f"(expected text/event-stream)", now)
        else:
            self._mode = _ERROR
            self._retry_after = _parse_retry_after(headers.get("retry-after"))

    def on_body(self, data: bytes, now: float) -> None:
        self.last_rx = now
        if self._mode == _SSE:
            self._on_events(self._sse.feed(data), now)  # type: ignore[union-attr]
            return
        self._size += len(data)
        limit = _MAX_BODY if self._mode == _JSON else _MAX_ERROR_BODY
        if self._size <= limit:
            self._parts.append(data)
        elif self._mode == _JSON:
            self._abort("error", f"response body larger than {_MAX_BODY} bytes", now)

    def on_end(self, now: float) -> None:
        self.conn = None  # the connection goes back to its pool by itself
        if self.done:
            return
        if self._mode == _SSE:
            tail = self._sse.pending  # type: ignore[union-attr]
            if tail:  # last event without its blank line: accept it
                self._on_events(self._sse.feed(b"\n\n"), now)  # type: ignore[union-attr]
                if self.done:
                    return
            if self._finish_seen or self.usage_out is not None:
                self.owner.finished(self, "ok", None, now)
            else:
                self.owner.finished(self, "error", self._lost_text("stream ended without [DONE]"), now)
        elif self._mode == _JSON:
            self._on_whole_body(b"".join(self._parts), now)
        else:
            body = b"".join(self._parts)
            self.owner.refused(self, self.http_status or 0, _error_text(self.http_status or 0, body),
                               self._retry_after, now)

    def on_lost(self, reason: str, got_response: bool, now: float) -> None:
        self.conn = None
        if self.done:
            return
        if got_response:
            self.owner.finished(self, "error", self._lost_text(reason), now)
        else:
            self.owner.failed_before_response(self, reason, now)

    # -- response interpretation -------------------------------------------
    def _on_events(self, events: list[tuple[bytes, bytes]], now: float) -> None:
        tokens = 0
        for name, payload in events:
            if payload == b"[DONE]":
                self._record(tokens, now)
                conn, self.conn = self.conn, None
                if conn is not None:
                    conn.detach()  # the response's last bytes may still come; then it is reusable
                self.owner.finished(self, "ok", None, now)
                return
            try:
                obj = _loads(payload)
            except ValueError:
                self._record(tokens, now)
                self._abort("error", f"malformed JSON in stream: {_clip(payload)}", now)
                return
            if type(obj) is not dict:
                self._record(tokens, now)
                self._abort("error", f"malformed stream chunk (not an object): {_clip(payload)}", now)
                return
            if name == b"error" or obj.get("error"):
                self._record(tokens, now)
                self._abort("error", f"server error in stream: {_message(obj)}", now)
                return
            choices = obj.get("choices")
            thought = self.reasoning
            n = self._count_choices(choices, now) if choices else 0
            usage = obj.get("usage")
            if choices and self._chunk_usage is None:
                self._chunk_usage = bool(usage)
            if usage:
                before = self.usage_out or 0
                self._take_usage(usage)
                # usage with every chunk (vLLM's and SGLang's continuous_usage_stats): the chunk's
                # own tokens, several when the server bundles them (speculative decoding), also
                # tokens whose text is empty (a random model's)
                out = usage.get("completion_tokens") if type(usage) is dict else None
                if choices and self._chunk_usage and type(out) is int:
                    n = max(out - before, 0)
                    if self.reasoning > thought:    # a reasoning delta counts its own tokens too: a server
                        self.reasoning += n - 1     # that falls behind bundles several into one
            tokens += n
        self._record(tokens, now)

    def _count_choices(self, choices: object, now: float) -> int:
        """1 if any choice carries text (one token per chunk), else 0; notes a finish reason, a
        reasoning chunk and the first answer chunk."""
        n = 0
        for c in choices if type(choices) is list else ():
            if type(c) is not dict:
                continue
            delta = c.get("delta")
            if type(delta) is dict:
                content = delta.get("content")
                if content:
                    n = 1
                    if self.answer_at is None:
                        self.answer_at = now
                    if self.answer is not None:
                        self.answer.append(content)
                elif delta.get("reasoning") or delta.get("reasoning_content"):
                    n = 1
                    self.reasoning += 1
            elif c.get("text"):
                n = 1
                if self.answer is not None:
                    self.answer.append(c["text"])
            if c.get("finish_reason"):
                self._finish_seen = True
        return n

    def _take_usage(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        out, inp = usage.get("completion_tokens"), usage.get("prompt_tokens")
        if isinstance(out, int):
            self.usage_out = out
        if isinstance(inp, int):
            self.usage_in = inp
        done = usage.get("completion_tokens_details")
        thought = done.get("reasoning_tokens") if isinstance(done, dict) else None
        if isinstance(thought, int):
            self.usage_reasoning = thought
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if isinstance(cached, int):
            self.cached = cached

    def _record(self, tokens: int, now: float) -> None:
        if tokens:
            self.last = now
            if self.first is None:
                self.first = now
                self.owner.first_token(self, now)
            self.chunks += tokens
            self.seg_start.append(now)
            self.seg_count.append(tokens)

    def _on_whole_body(self, body: bytes, now: float) -> None:
        try:
            obj = _loads(body)
        except ValueError:
            self.owner.finished(self, "error", f"malformed JSON response: {_clip(body)}", now)
            return
        if not isinstance(obj, dict) or obj.get("error"):
            self.owner.finished(self, "error", f"server error: {_message(obj)}", now)
            return
        text = ""
        for c in obj.get("choices") or ():
            if isinstance(c, dict):
                msg = c.get("message")
                text = (msg.get("content") if isinstance(msg, dict) else c.get("text")) or text
        self._take_usage(obj.get("usage"))
        if self.answer is not None and isinstance(text, str):
            self.answer.append(text)
        self._record(1 if text else 0, now)
        self._finish_seen = True
        self.owner.finished(self, "ok", None, now)

    def _lost_text(self, reason: str) -> str:
        return f"{reason} (after {self.chunks} tokens)" if self.chunks else reason

    def _abort(self, status: str, error: str, now: float) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abort()
        self.owner.finished(self, status, error, now)

    # -- result -------------------------------------------------------------
    def output_tokens(self) -> tuple[int, bool]:
        """``(output tokens, estimated?)``: the server's usage when sent, else the chunk count."""
        if self.usage_out is not None:
            return self.usage_out, False
        return self.chunks, True

    def reasoning_tokens(self) -> int | None:
        """Reasoning tokens of the output (the server's count when it sends a positive one, else the
        reasoning chunks); None when there were none."""
        return self.usage_reasoning or self.reasoning or None


def _clip(raw: bytes, n: int = 80) -> str:
    text = raw[:n].decode("utf-8", "replace").replace("\n", " ")
    return text + ("..." if len(raw) > n else "")


def _message(obj: object) -> str:
    """The human part of an OpenAI-style error object, shortened to one line."""
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        err = err.get("message") or err.get("detail") or err
    elif isinstance(obj, dict) and "detail" in obj:
        err = obj["detail"]
    return " ".join(str(err).split())[:200]


def _error_text(status: int, body: bytes) -> str:
    try:
        detail = _message(_loads(body)) if body else ""
    except ValueError:
        detail = " ".join(body[:200].decode("utf-8", "replace").split())
    return f"HTTP {status}: {detail}" if detail else f"HTTP {status}"


def _parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to the configured backoff
