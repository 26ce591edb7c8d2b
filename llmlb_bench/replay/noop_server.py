"""A no-op OpenAI-compatible streaming server, fast enough to measure the client.

Used to measure the replayer itself (benchmarks/replay_throughput.py, the
tests): it answers ``/v1/chat/completions`` and ``/v1/completions`` by
streaming ``max_tokens`` one-token SSE chunks, optionally after ``ttft_s``
and ``itl_s`` apart, and records for each request (by its
``X-Request-Id``) when it had read the request and when it started writing the first
and last token, on ``time.perf_counter`` - the same system-wide monotonic
clock the replayer uses on Linux, so client-side inflation can be computed
exactly. ``GET /stats`` returns those records. A client that sends no
request id (GuideLLM) gets the record's key (``n<count>``) as the text of
its first token, so its own output names the record.

It is a raw asyncio protocol rather than an aiohttp app because aiohttp's
per-chunk write path costs more CPU than the whole client under test.
Its tokenizer counts one token per byte (``/tokenize`` and ``usage``), like
the byte-level tiny models of the real-engine test.

Run: ``python -m llmlb_bench.replay.noop_server --port 8000 [--ttft-ms 0] [--itl-ms 0]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Mapping

from llmlb_bench.eventloop import new_event_loop
from llmlb_bench.gcpause import pause_full_collections
from llmlb_bench.openfiles import raise_open_files_limit


@dataclass
class NoopConfig:
    model: str = "noop"
    ttft_s: float = 0.0
    itl_s: float = 0.0
    #: send ``usage`` in the last chunk when the client asks for it
    usage: bool = True
    #: per-request timestamps for ``/stats``: request_id -> (received, first token, last token, tokens)
    records: dict[str, list[float]] = field(default_factory=dict)
    #: streams being written now, published on ``/metrics`` under vLLM's gauge names
    running: int = 0
    #: completion requests read so far, published on ``/metrics`` as ``llmlb:requests_received_total``
    received: int = 0


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: Mapping[str, object]) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _token_event(api: str, text: str) -> bytes:
    if api == "chat":
        return _event({"id": "noop", "object": "chat.completion.chunk", "model": "noop",
                       "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
    return _event({"id": "noop", "object": "text_completion", "model": "noop",
                   "choices": [{"index": 0, "text": text, "finish_reason": None}]})


_TOKEN = {api: _token_event(api, " tok") for api in ("chat", "completions")}
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n")
_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _json_response(status: int, obj: object) -> bytes:
    body = json.dumps(obj).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (status, reason.encode(), len(body))) + body


def _prompt_text(req: dict[str, Any], api: str) -> str:
    """The prompt's text: a completions prompt, or the chat messages' text, whether each
    message's content is a string or a list of parts (as other benchmark clients send). ``req``: the
    client's JSON body, as any client wrote it (Any)."""
    if api != "chat":
        prompt = req.get("prompt", "")
        return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    texts = []
    for msg in req.get("messages") or ():
        content = msg.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return "".join(texts)


class NoopProtocol(asyncio.Protocol):
    """One client connection; requests are answered in order."""

    def __init__(self, cfg: NoopConfig) -> None:
        self.cfg = cfg
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
        length = int(headers.get("content-length", "0"))
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4:end + 4 + length]
        self.buf = self.buf[end + 4 + length:]
        method, path = (head[0].split(" ") + ["", ""])[:2]
        self._route(method, path, headers, body, perf_counter())

    def _route(self, method: str, path: str, headers: dict[str, str], body: bytes, now: float) -> None:
        assert self.transport is not None
        cfg = self.cfg
        if method == "GET" and path == "/v1/models":
            self._reply(_json_response(200, {"object": "list", "data": [{"id": cfg.model, "object": "model"}]}))
        elif method == "GET" and path == "/health":
            self._reply(_json_response(200, {"status": "ok"}))
        elif method == "GET" and path == "/metrics":
            text = (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"{cfg.model}\"}} "
                    f"{cfg.running}\nvllm:num_requests_waiting{{model_name=\"{cfg.model}\"}} 0\n"
                    f"# TYPE llmlb:requests_received_total counter\nllmlb:requests_received_total {cfg.received}\n"
                    ).encode()
            self._reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n%s"
                        % (len(text), text))
        elif method == "GET" and path == "/stats":
            self._reply(_json_response(200, cfg.records))
        elif method == "POST" and path == "/tokenize":
            req = json.loads(body or b"{}")
            prompt = req.get("content") or req.get("prompt") or ""
            self._reply(_json_response(200, {"tokens": list(prompt.encode())}))
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            self._complete("chat" if "chat" in path else "completions", headers, body, now)
        else:
            self._reply(_json_response(404, {"error": {"message": f"no route {method} {path}"}}))

    def _reply(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)
        self._next()

    def _complete(self, api: str, headers: dict[str, str], body: bytes, now: float) -> None:
        self.cfg.received += 1
        req = json.loads(body)
        n = max(1, int(req.get("max_tokens") or req.get("max_completion_tokens") or 16))
        prompt = _prompt_text(req, api)
        usage = self.cfg.usage and bool((req.get("stream_options") or {}).get("include_usage"))
        rid = headers.get("x-request-id")
        key = rid if rid is not None else f"n{len(self.cfg.records)}"
        record = self.cfg.records[key] = [now, 0.0, 0.0, n]
        tail = _event({"id": "noop", "choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": "length"}]})
        if usage:
            tail += _event({"id": "noop", "choices": [], "usage": {
                "prompt_tokens": len(prompt.encode()), "completion_tokens": n,
                "total_tokens": len(prompt.encode()) + n}})
        tail += _DONE
        token = _TOKEN[api]
        first = token if rid is not None else _token_event(api, f" {key}")
        assert self.transport is not None
        if self.cfg.ttft_s <= 0 and self.cfg.itl_s <= 0:
            record[1] = perf_counter()
            self.transport.write(_SSE_HEAD + first)
            record[2] = perf_counter()
            self.transport.write(token * (n - 1) + tail)
            self._next()
            return
        self.busy = True
        self.cfg.running += 1
        self.transport.write(_SSE_HEAD)
        loop = asyncio.get_running_loop()

        def send(i: int) -> None:
            if self.transport is None or self.transport.is_closing():
                self.cfg.running -= 1
                return
            t = perf_counter()
            self.transport.write(first if i == 0 else token)
            if i == 0:
                record[1] = t
            if i + 1 < n:
                loop.call_later(self.cfg.itl_s, send, i + 1)
            else:
                record[2] = t
                self.transport.write(tail)
                self.cfg.running -= 1
                self.busy = False
                self._next()

        loop.call_later(self.cfg.ttft_s, send, 0)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def start(cfg: NoopConfig, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Start serving on the running loop; the port is ``server.sockets[0].getsockname()[1]``."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: NoopProtocol(cfg), host, port, backlog=4096)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="No-op OpenAI-compatible streaming server (client benchmarks).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", default="noop")
    ap.add_argument("--ttft-ms", type=float, default=0.0)
    ap.add_argument("--itl-ms", type=float, default=0.0)
    ap.add_argument("--no-usage", action="store_true", help="never send usage (clients must count chunks)")
    ap.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU core")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    raise_open_files_limit()   # one socket per stream
    pause_full_collections()   # the truth clients are measured against must not stall (see gcpause)
    cfg = NoopConfig(model=args.model, ttft_s=args.ttft_ms / 1e3, itl_s=args.itl_ms / 1e3, usage=not args.no_usage)
    loop, _ = new_event_loop()
    server = loop.run_until_complete(start(cfg, args.host, args.port))
    print(f"listening on {args.host}:{server.sockets[0].getsockname()[1]}", flush=True)
    try:
        loop.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
