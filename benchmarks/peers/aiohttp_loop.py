"""The baseline of benchmarks/replay_vs_peers.py: a bare aiohttp client loop, as one would write it.

One asyncio event loop (the standard one), one ``aiohttp.ClientSession``,
one task per request: open loop at a constant rate (``--rate``; each task
sleeps until its scheduled time), or closed loop (``--concurrency``: that
many tasks, each sending its next request when the last one ended, for
``--seconds``). Each request streams a chat completion with an
``X-Request-Id`` and reads the SSE lines as they come; the first line
carrying a token is the first token. Times are ``time.perf_counter`` (on
Linux the system-wide monotonic clock, the no-op server's clock too).
Writes one JSON line per finished request: id, scheduled, first token, end
(seconds on that clock), ok.

    python benchmarks/peers/aiohttp_loop.py URL OUT.jsonl (--rate R --seconds S | --concurrency C --seconds S)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiohttp


def body(tokens: int, prompt_words: int) -> dict:
    return {"model": "noop", "stream": True, "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": " the" * prompt_words}]}


async def one(session: aiohttp.ClientSession, url: str, rid: int, payload: dict, scheduled: float) -> dict:
    first = None
    ok = False
    async with session.post(f"{url}/v1/chat/completions", json=payload, headers={"X-Request-Id": str(rid)}) as resp:
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                ok = resp.status == 200
                break
            chunk = json.loads(data)
            if first is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                first = time.perf_counter()
    return {"id": rid, "scheduled": scheduled, "first": first, "end": time.perf_counter(), "ok": ok and first is not None}


async def main_async(args: argparse.Namespace) -> list[dict]:
    payload = body(args.tokens, args.prompt_words)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        start = time.perf_counter() + 0.2
        if args.rate:
            async def at(rid: int, when: float) -> dict:
                await asyncio.sleep(max(0.0, when - time.perf_counter()))
                return await one(session, args.url, rid, payload, when)
            n = int(args.rate * args.seconds)
            return await asyncio.gather(*(at(k, start + k / args.rate) for k in range(n)))
        end = start + args.seconds
        results: list[dict] = []
        counter = iter(range(1 << 30))

        async def user() -> None:
            await asyncio.sleep(max(0.0, start - time.perf_counter()))
            while time.perf_counter() < end:
                results.append(await one(session, args.url, next(counter), payload, time.perf_counter()))
        await asyncio.gather(*(user() for _ in range(args.concurrency)))
        return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("out")
    ap.add_argument("--rate", type=float)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=128)
    args = ap.parse_args()
    rows = asyncio.run(main_async(args))
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
