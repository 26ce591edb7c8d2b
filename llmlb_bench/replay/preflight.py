"""What the replayer learns from the endpoints before a run starts.

Run before the results folder is created, so that a wrong URL, a missing
model or a missing API key stops the command with one line and leaves
nothing half-written: each endpoint is asked for ``/v1/models`` (model
discovery and a health check in one), and, for exact prompt lengths, the
first healthy endpoint's ``/tokenize`` (``tokenize``) or a local tokenizer
file (``tokenizer``) measures how many tokens each prompt piece costs and
counts a sample of the trace's prompts (:mod:`llmlb_bench.replay.lengths`).
An endpoint that does not answer is reported and marked unhealthy; the run
goes ahead if at least one answers.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from llmlb_bench import __version__
from llmlb_bench.errors import UserError
from llmlb_bench.redact import add_secret
from llmlb_bench.replay.http import Endpoint, Pool, parse_endpoint, simple_request
from llmlb_bench.replay.lengths import Counter, check_note, exact_lengths, load_tokenizer, local_counter
from llmlb_bench.run_summary import LengthCheck
from llmlb_bench.replay.options import ReplayOptions

if TYPE_CHECKING:
    from tokenizers import Tokenizer

DEFAULT_KEY_ENV = "OPENAI_API_KEY"


@dataclass
class Preflight:
    """Endpoints, their models and health, optional piece costs, and warnings for the user."""

    endpoints: list[Endpoint]
    models: list[str]
    healthy: list[bool]
    #: tokens of each prompt piece after other text and at a prompt's start (exact lengths), or None
    word_costs: list[int] | None = None
    lead_costs: list[int] | None = None
    notes: list[str] = field(default_factory=list)
    #: how prompt lengths are made, as run.json states it
    prompt_lengths: str = "approximate (one word per token)"
    #: whole prompts of a sample of the trace counted before the run (exact lengths only)
    length_check: LengthCheck | None = None


def request_headers(options: ReplayOptions) -> str:
    """Header lines every request carries; the API key (if any) goes only here."""
    env = options.api_key_env or DEFAULT_KEY_ENV
    key = os.environ.get(env)
    if options.api_key_env and not key:
        raise UserError(f"environment variable {options.api_key_env} is not set", "--api-key-env")
    add_secret(key)  # never stored or printed, whatever a server echoes back
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"User-Agent: llmlb-bench/{__version__}\r\n{auth}")


def preflight(urls: list[str], options: ReplayOptions, trace: pa.Table | None = None) -> Preflight:
    """Parse and probe the endpoints, and measure piece costs for exact prompt lengths (checked
    on ``trace``'s prompts when given); UserError if no endpoint works."""
    if not urls:
        raise UserError("at least one --endpoint is needed", "--endpoint")
    if options.tokenize and options.tokenizer:
        raise UserError("give --tokenize (the server's count) or --tokenizer (a local file), not both",
                        "--tokenizer")
    tokenizer = load_tokenizer(options.tokenizer) if options.tokenizer else None
    endpoints = [parse_endpoint(u) for u in urls]
    seen: set[str] = set()
    for ep in endpoints:
        if ep.url in seen:
            raise UserError(f"endpoint {ep.url} is given twice", "--endpoint")
        seen.add(ep.url)
    headers = request_headers(options)
    return asyncio.run(_probe_all(endpoints, headers, options, tokenizer, trace))


async def _probe_all(endpoints: list[Endpoint], headers: str, options: ReplayOptions,
                     tokenizer: Tokenizer | None, trace: pa.Table | None) -> Preflight:
    timeout = options.timeouts.connect or 10.0
    pools = [Pool(ep, timeout) for ep in endpoints]
    try:
        answers = await asyncio.gather(*(_models(p, headers, timeout) for p in pools))
        healthy = [err is None for _, err in answers]
        notes = [f"endpoint {ep.url} is down at start ({err}); it is retried during the run"
                 for ep, (_, err) in zip(endpoints, answers) if err is not None]
        if not any(healthy):
            detail = "; ".join(f"{ep.url}: {err}" for ep, (_, err) in zip(endpoints, answers))
            raise UserError(f"no endpoint answered ({detail})", "--endpoint")
        models: list[str] = []
        for ep, (listed, err) in zip(endpoints, answers):
            if options.model:
                models.append(options.model)
            elif listed:
                models.append(listed[0])
            elif err is None:
                raise UserError(f"{ep.url}/v1/models lists no model; pass --model", "--endpoint")
            else:
                models.append("")
        fallback = next(m for m in models if m)
        models = [m or fallback for m in models]
        if options.model:
            for ep, (listed, err) in zip(endpoints, answers):
                if err is None and listed and options.model not in listed:
                    notes.append(f"endpoint {ep.url} does not list model {options.model!r} "
                                 f"(it lists {', '.join(listed[:5])})")
        pre = Preflight(endpoints, models, healthy, notes=notes)
        count: Counter | None = None
        if tokenizer is not None:
            count, source, where = local_counter(tokenizer), f"local tokenizer {options.tokenizer}", "--tokenizer"
        elif options.tokenize:
            first = healthy.index(True)
            count = _server_counter(pools[first], headers, models[first], timeout)
            source, where = "tokenize endpoint", "--tokenize"
        if count is not None:
            pre.word_costs, pre.lead_costs, pre.length_check = await exact_lengths(count, trace, where)
            pre.prompt_lengths = f"exact ({source})"
            notes += check_note(pre.length_check, source)
        return pre
    finally:
        for p in pools:
            p.close_all()


async def _models(pool: Pool, headers: str, timeout: float) -> tuple[list[str], str | None]:
    """``(model ids, None)`` from ``/v1/models``, or ``([], reason)`` when the endpoint is down.

    An endpoint that answers but has no usable model list counts as up (``([], None)``)."""
    try:
        status, body = await simple_request(pool, "GET", "/v1/models", headers, timeout=timeout)
    except asyncio.TimeoutError:
        return [], f"no answer within {timeout:g} s"
    except OSError as exc:
        return [], f"connect failed: {exc.strerror or exc}"
    if status in (401, 403):
        raise UserError(f"{pool.endpoint.url}/v1/models answered HTTP {status}: check the API key",
                        "--endpoint")
    if status != 200:
        return [], None
    try:
        data = json.loads(body).get("data") or []
        return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)], None
    except (ValueError, AttributeError):
        return [], None


def _server_counter(pool: Pool, headers: str, model: str, timeout: float) -> Counter:
    """A counter that asks the server's ``/tokenize`` (vLLM, llama.cpp), one text at a time."""
    async def one(text: str) -> int:
        body = json.dumps({"model": model, "prompt": text, "content": text}).encode()
        try:
            status, raw = await simple_request(pool, "POST", "/tokenize", headers, body, timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise UserError(f"{pool.endpoint.url}/tokenize failed: {exc}", "--tokenize") from None
        if status != 200:
            raise UserError(f"{pool.endpoint.url}/tokenize answered HTTP {status}", "--tokenize")
        try:
            obj = json.loads(raw)
            return int(obj["count"]) if "count" in obj else len(obj["tokens"])
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{pool.endpoint.url}/tokenize answered something else than "
                            "{'tokens': [...]} or {'count': n}", "--tokenize") from None

    async def count(texts: list[str]) -> list[int]:
        return [await one(t) for t in texts]
    return count
