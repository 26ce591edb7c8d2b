"""The replayer against real servers on 127.0.0.1: timing, accounting, routing, prompts, CLI."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import socket
import struct
import zlib
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from conftest import cli, make_trace
from replay_helpers import run_replay, servers, token_count  # noqa: F401  (servers is a fixture)
from shape_check import mismatches

from llmlb_bench.errors import UserError
from llmlb_bench.run_summary import RunSummary
from llmlb_bench.policies import Policy, RouteRequest, View
from llmlb_bench.policies.base import HOLD, REJECT
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.replay.http import Pool, parse_endpoint
from llmlb_bench.replay.noop_server import NoopConfig
from llmlb_bench.replay.prompts import PIECES, PromptBuilder
from llmlb_bench.replay.sse import SSEDecoder
from llmlb_bench.schema import TRACE, write_trace


# -- pieces ------------------------------------------------------------------
def test_sse_decoder_gives_the_same_events_however_the_bytes_are_split():
    stream = (b": ping\n\ndata: {\"a\": 1}\n\nevent: error\ndata: {\"b\":\ndata: 2}\n\n"
              b"data:{\"c\": 3}\r\n\r\ndata: [DONE]\n\n")
    expected = [(b"", b'{"a": 1}'), (b"error", b'{"b":\n2}'), (b"", b'{"c": 3}'), (b"", b"[DONE]")]
    rng = random.Random(1)
    for _ in range(200):
        dec, got, pos = SSEDecoder(), [], 0
        while pos < len(stream):
            step = rng.randint(1, 7)
            got += dec.feed(stream[pos:pos + step])
            pos += step
        assert got == expected
        assert dec.pending == b""


def test_prompts_share_exactly_the_hashed_prefix_and_are_deterministic():
    b1, b2 = PromptBuilder(16), PromptBuilder(16)
    a = b1.text(48, [11, 12, 13], request_id=1)
    c = b2.text(48, [11, 12, 99], request_id=2)
    assert a == b1.text(48, [11, 12, 13], request_id=1)  # same inputs, same text
    aw, cw = a.split(" ")[1:], c.split(" ")[1:]
    assert len(aw) == len(cw) == 48  # one word per token in the default approximation
    shared = next(i for i, (x, y) in enumerate(zip(aw, cw)) if x != y)
    assert shared == 32  # two shared blocks of 16, then they differ
    # tokens beyond the hashes: unique per request
    assert b1.text(20, None, 5).split(" ")[1:4] != b1.text(20, None, 6).split(" ")[1:4]


def test_prompts_hit_exact_token_counts_with_measured_word_costs():
    costs = [len(p) for p in PIECES]  # a byte-level tokenizer: one token per character, no 1-token word
    b = PromptBuilder(16, costs)
    for n in range(1, 100):
        assert len(b.text(n, [1, 2, 3], request_id=n)) == n
    assert len(b.text(2000, [1, 2, 3], request_id=0)) == 2000
    # exact filling keeps the sharing: texts agree on shared blocks and part right after them
    a, c, d = b.text(64, [1, 2, 3, 4], 0), b.text(64, [1, 2, 8, 9], 1), b.text(64, [5, 6, 7, 8], 2)
    assert 32 <= len(os.path.commonprefix([a, c])) < 40
    assert len(os.path.commonprefix([a, d])) < 8


def test_endpoint_urls_are_normalised_and_bad_ones_refused():
    ep = parse_endpoint("http://localhost:8000/v1/")
    assert (ep.url, ep.prefix, ep.port) == ("http://localhost:8000", "", 8000)
    assert parse_endpoint("https://api.example.com/proxy/v1").url == "https://api.example.com:443/proxy"
    for bad in ("localhost:8000", "ftp://x", "http://", "http://h:99999", "http://u:p@h/"):
        with pytest.raises(UserError):
            parse_endpoint(bad)


async def _until(cond, timeout: float = 300.0) -> None:   # a hang's bound: returns once it holds
    end = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < end, "condition not reached"
        await asyncio.sleep(0.01)


def test_pool_keeps_spare_connections_ahead_of_need_and_leaves_a_dead_endpoint_alone():
    async def main() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)
            await reader.read()  # until the client closes

        srv = await asyncio.start_server(hold, "127.0.0.1", 0)
        pool = Pool(parse_endpoint(f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"), 5.0, spare=3)
        pool.top_up()
        await _until(lambda: len(accepted) == 3 and not pool._opening)
        assert pool.take_idle() is not None  # a spare, ready; taking it opens the next one
        await _until(lambda: len(accepted) == 4 and not pool._opening)
        await asyncio.sleep(0.05)
        assert len(accepted) == 4  # one in use + three spare, no more
        pool.close_all()
        srv.close()

        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()  # nothing listens there now
        down = Pool(parse_endpoint(f"http://127.0.0.1:{port}"), 5.0, spare=3)
        down.top_up()
        await _until(lambda: not down._opening)
        assert down.take_idle() is None and not down._opening  # no new attempts after a failed one

    asyncio.run(main())


_SSE_BODY = (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
             b'data: {"choices":[{"delta":{"content":"b"},"finish_reason":"length"}]}\n\n'
             b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\ndata: [DONE]\n\n')


def _framed(mode: str) -> bytes:
    """The same answer framed three ways HTTP/1.1 allows."""
    if mode == "chunked":  # with a chunk extension and a trailer
        half = len(_SSE_BODY) // 2
        return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"%x;ext=1\r\n%s\r\n" % (half, _SSE_BODY[:half])
                + b"%x\r\n%s\r\n" % (len(_SSE_BODY) - half, _SSE_BODY[half:]) + b"0\r\nX-Trailer: 1\r\n\r\n")
    if mode == "until-close":
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + _SSE_BODY
    body = b'{"choices":[{"message":{"content":"ab"}}],"usage":{"prompt_tokens":4,"completion_tokens":2}}'
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.mark.parametrize("mode", ["chunked", "until-close", "json"])
def test_responses_are_parsed_however_the_bytes_arrive(servers, tmp_path, mode):  # noqa: F811
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # the client closed its connection
            lengths = [h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")]
            await reader.readexactly(int(lengths[0]) if lengths else 0)
            if head.startswith(b"GET /v1/models"):
                body = b'{"data":[{"id":"m"}]}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                continue
            for i in range(0, len(raw := _framed(mode))):  # one byte per write
                writer.write(raw[i:i + 1])
                await writer.drain()
                await asyncio.sleep(0)
            if mode == "until-close":
                writer.close()
                return

    async def start() -> str:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers._cleanups.append(lambda: _close(srv))
        return f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"

    url = servers.call(start)
    _, rows, _ = run_replay(make_trace(n=3, rate=50.0, output_tokens=2), [url], tmp_path)
    for r in rows:
        assert r["status"] == "ok" and r["output_tokens"] == 2 and r["server_input_tokens"] == 4, r["error"]
        assert token_count(r) == (1 if mode == "json" else 2)


async def _close(srv: asyncio.AbstractServer) -> None:
    srv.close()


# -- replays -----------------------------------------------------------------
def test_every_request_streams_and_is_timed_from_its_schedule(servers, tmp_path):  # noqa: F811
    url, cfg = servers.noop(NoopConfig(ttft_s=0.002, itl_s=0.001))
    trace = make_trace(n=40, rate=200.0, input_tokens=30, output_tokens=6)
    summary, rows, run_dir = run_replay(trace, [url], tmp_path)
    assert [r["request_id"] for r in rows] == list(range(40))
    assert {r["status"] for r in rows} == {"ok"}
    t0 = summary["client"]["t0_clock_s"]
    for r in rows:
        assert r["scheduled_s"] == pytest.approx(r["request_id"] / 200.0)
        assert r["scheduled_s"] <= r["sent_s"] < r["first_token_s"] <= r["last_token_s"]
        assert r["output_tokens"] == 6 and token_count(r) == 6 and r["output_tokens_estimated"] is False
        assert r["server_input_tokens"] > 0 and r["http_status"] == 200
        recv, first, last, n = cfg.records[str(r["request_id"])]
        # same monotonic clock: the client saw each token after the server wrote it
        assert first <= r["first_token_s"] + t0 and last <= r["last_token_s"] + t0
        assert recv >= r["sent_s"] + t0
    assert summary["statuses"] == {"ok": 40}
    meta = json.loads((run_dir / "run.json").read_text())
    # the dispatcher's lateness is read as each request leaves, so it cannot exceed what the rows
    # show (sent_s - scheduled_s); a bound in milliseconds would flake on a loaded machine
    lag = meta["summary"]["client"]["dispatch_lag_ms"]
    worst_ms = max(r["sent_s"] - r["scheduled_s"] for r in rows) * 1e3
    assert 0 <= lag["p50"] <= lag["p99"] <= lag["max"] <= worst_ms + 1e-3
    assert mismatches(meta["summary"], RunSummary, "summary") == []   # the shape run_summary.py declares


def test_self_check_measures_the_client_against_a_local_noop_server():
    from llmlb_bench.replay.selfcheck import self_check

    trace = make_trace(n=200, rate=100.0, output_tokens=8)  # 2 s; the check replays the first 0.5 s
    fig = self_check(trace, ReplayOptions(), seconds=0.5, lag_threshold_ms=1e9)
    assert fig["requests"] == fig["ok"] == 50 and fig["trace_rate_rps"] == pytest.approx(100.0)
    # never sent early: the sends span at least the schedule's 0.49 s less the latest lateness, whatever
    # the machine's load (a fixed tolerance around 100/s would flake on a loaded machine)
    late_s = fig["send_lateness_ms"]["max"] / 1e3
    assert 0 < fig["send_rate_rps"] and (late_s >= 0.49 or fig["send_rate_rps"] <= 49 / (0.49 - late_s) + 1e-3)
    for key in ("send_lateness_ms", "ttft_inflation_ms"):
        assert 0 <= fig[key]["p50"] <= fig[key]["p99"] <= fig[key]["max"]  # the server wrote before we read
    assert fig["flagged"] is False


def test_multimodal_rows_carry_real_images_and_audio(servers, tmp_path):  # noqa: F811
    bodies = []

    async def models(request):
        return web.json_response({"data": [{"id": "m"}]})

    async def chat(request):
        bodies.append(await request.json())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    url = servers.aiohttp(app)
    trace = TRACE.conform(pa.table({
        "request_id": pa.array([1, 2], pa.int64()), "arrival_s": [0.0, 0.01],
        "input_tokens": pa.array([300, 140], pa.int32()), "output_tokens": pa.array([1, 1], pa.int32()),
        "images": pa.array([2, 0], pa.int16()), "image_tokens": pa.array([128, 0], pa.int32()),
        "audio_s": pa.array([0.0, 1.6], pa.float32())}), "t")
    _, rows, _ = run_replay(trace, [url], tmp_path)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    first, second = sorted(bodies, key=lambda b: len(b["messages"][0]["content"]), reverse=True)
    text, *images = first["messages"][0]["content"]
    assert len(text["text"].split()) == 300 - 128  # the images cost the rest of the prompt
    pngs = [base64.b64decode(i["image_url"]["url"].split(",", 1)[1]) for i in images]
    assert len(pngs) == 2 and pngs[0] != pngs[1]
    for png in pngs:  # 64 tokens each -> 8x8 tiles of 28 px
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (224, 224)
        assert len(zlib.decompress(png[41:-16])) == 224 * (1 + 224 * 3)  # the image data is intact
    text, audio = second["messages"][0]["content"]
    assert len(text["text"].split()) == 140 - 40  # 1.6 s of audio is 40 tokens
    wav = base64.b64decode(audio["input_audio"]["data"])
    assert wav[:4] == b"RIFF" and len(wav) == 44 + 2 * 16000 * 1.6


def test_output_tokens_are_counted_and_flagged_when_the_server_sends_no_usage(servers, tmp_path):  # noqa: F811
    url, _ = servers.noop(NoopConfig(usage=False))
    _, rows, _ = run_replay(make_trace(n=5, rate=100.0, output_tokens=7), [url], tmp_path)
    assert all(r["output_tokens"] == 7 and r["output_tokens_estimated"] is True for r in rows)
    assert all(r["server_input_tokens"] is None for r in rows)


def test_tokenize_makes_prompt_lengths_exact(servers, tmp_path):  # noqa: F811
    url, _ = servers.noop()  # its tokenizer counts bytes, so words cost 3..11 tokens each
    trace = TRACE.conform(pa.table({
        "request_id": pa.array(range(6), pa.int64()), "arrival_s": [0.01 * i for i in range(6)],
        "input_tokens": pa.array([12, 51, 100, 257, 1000, 64], pa.int32()),
        "output_tokens": pa.array([2] * 6, pa.int32()),
        "prefix_hashes": pa.array([[1], [1, 2, 3], [1, 2], [], None, [7, 8, 9, 10]], pa.list_(pa.uint64()))}), "t")
    opts = ReplayOptions(api="completions", tokenize=True)
    summary, rows, _ = run_replay(trace, [url], tmp_path, options=opts)
    assert [r["server_input_tokens"] for r in rows] == [12, 51, 100, 257, 1000, 64]
    assert summary["prompt_lengths"].startswith("exact")


def test_round_robin_splits_evenly_and_least_outstanding_avoids_the_slow_endpoint(servers, tmp_path):  # noqa: F811
    fast, _ = servers.noop()
    # The slow endpoint holds every request past the end of the 0.4 s schedule, so its
    # outstanding count only grows; the fast one frees its requests within milliseconds,
    # even on a loaded machine, so JSQ keeps choosing it.
    slow, _ = servers.noop(NoopConfig(ttft_s=1.0, itl_s=0.02))
    trace = make_trace(n=40, rate=100.0, output_tokens=5)
    _, rows, _ = run_replay(trace, [fast, slow], tmp_path, "round_robin", run_id="rr")
    assert Counter(r["target"] for r in rows) == {fast: 20, slow: 20}
    _, rows, _ = run_replay(trace, [fast, slow], tmp_path, "least_outstanding", run_id="lo")
    by = Counter(r["target"] for r in rows)
    assert by[fast] > 3 * by[slow]


def test_dependent_requests_leave_after_their_parent_ends(servers, tmp_path):  # noqa: F811
    url, _ = servers.noop(NoopConfig(itl_s=0.01))
    trace = TRACE.conform(pa.table({
        "request_id": pa.array([1, 2, 3], pa.int64()), "arrival_s": [0.0, 0.0, 0.01],
        "parent_id": pa.array([None, 1, 2], pa.int64()), "after_parent_s": [None, 0.05, 0.0],
        "input_tokens": pa.array([10] * 3, pa.int32()), "output_tokens": pa.array([5] * 3, pa.int32())}), "t")
    _, rows, _ = run_replay(trace, [url], tmp_path)
    r1, r2, r3 = rows
    assert r2["scheduled_s"] >= r1["last_token_s"] + 0.05 - 1e-9
    assert r3["scheduled_s"] >= r2["last_token_s"] - 1e-9
    assert all(r["sent_s"] >= r["scheduled_s"] for r in rows)


def test_closed_loop_keeps_exactly_n_users_busy(servers, tmp_path):  # noqa: F811
    url, _ = servers.noop(NoopConfig(ttft_s=0.01, itl_s=0.005))
    trace = make_trace(n=15, rate=1000.0, output_tokens=4)
    _, rows, _ = run_replay(trace, [url], tmp_path, options=ReplayOptions(users=3, think_s=0.02))
    assert {r["status"] for r in rows} == {"ok"}
    assert [r["scheduled_s"] for r in rows[:3]] == [0.0] * 3  # three users start together
    ends = sorted(r["last_token_s"] for r in rows)
    for r in rows[3:]:  # every later request waits for a user: some request ended think_s before it
        assert any(abs(r["scheduled_s"] - (e + 0.02)) < 1e-3 for e in ends)
    events = sorted([(r["sent_s"], 1) for r in rows] + [(r["last_token_s"], -1) for r in rows])
    assert max(np.cumsum([d for _, d in events])) == 3


def test_worker_processes_share_one_run_and_one_clock(servers, tmp_path):  # noqa: F811
    url, cfg = servers.noop(NoopConfig(itl_s=0.002))
    trace = TRACE.conform(pa.table({
        "request_id": pa.array(range(60), pa.int64()), "arrival_s": [i / 200 for i in range(60)],
        "parent_id": pa.array([None if i % 3 == 0 else i - 1 for i in range(60)], pa.int64()),
        "after_parent_s": [0.0] * 60,
        "input_tokens": pa.array([20] * 60, pa.int32()), "output_tokens": pa.array([4] * 60, pa.int32())}), "t")
    summary, rows, run_dir = run_replay(trace, [url], tmp_path, options=ReplayOptions(workers=2))
    assert [r["request_id"] for r in rows] == list(range(60)) and {r["status"] for r in rows} == {"ok"}
    assert summary["client"]["workers"] == 2 and summary["statuses"] == {"ok": 60}
    by_id = {r["request_id"]: r for r in rows}
    for r in rows:  # one clock: schedule, dependencies and the server's timestamps all agree
        assert r["sent_s"] >= r["scheduled_s"] - 1e-9
        if r["request_id"] % 3:
            assert r["scheduled_s"] >= by_id[r["request_id"] - 1]["last_token_s"] - 1e-9
        assert cfg.records[str(r["request_id"])][1] <= r["first_token_s"] + summary["client"]["t0_clock_s"]
    assert not (run_dir / ".workers").exists()


class _Watcher(Policy):
    """Round robin that records the scraped signals it was shown."""

    name = "watcher"

    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []
        self.n = 0

    def choose(self, req: RouteRequest, view: View) -> int:
        self.seen.append((view.running[0], view.signal_time[0]))
        self.n += 1
        return self.n % len(view)


def test_engine_metrics_are_scraped_into_the_view_and_series(servers, tmp_path):  # noqa: F811
    url, _ = servers.noop(NoopConfig(itl_s=0.01))  # publishes vllm:num_requests_running
    bare, _ = servers.noop()
    policy = _Watcher()
    trace = make_trace(n=40, rate=100.0, output_tokens=20)
    summary, _, run_dir = run_replay(trace, [url, bare], tmp_path, policy, ReplayOptions(scrape_s=0.05))
    series = pq.read_table(run_dir / "series.parquet").to_pylist()
    assert summary["scraped_metrics"] == sorted([url, bare])
    assert series and {r["target"] for r in series} == {url, bare}
    assert max(r["running"] for r in series if r["target"] == url) >= 5  # ~0.2 s streams at 100/s
    times = [r["t_s"] for r in series if r["target"] == url]
    # periodic scrapes keep the interval; the last one comes once every answer is in
    assert all(b - a >= 0.04 for a, b in zip(times[:-2], times[1:-1]))
    ends = pq.read_table(run_dir / "requests.parquet").column("last_token_s").to_pylist()
    assert times[-1] >= max(ends)
    assert max(running for running, _ in policy.seen) >= 5 and policy.seen[-1][1] > 0


def test_endpoints_without_metrics_are_not_asked_again(servers, tmp_path):  # noqa: F811
    calls = []

    async def metrics(request):
        calls.append(1)
        return web.Response(status=404)

    async def models(request):
        return web.json_response({"data": [{"id": "m"}]})

    async def chat(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
        return resp

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    url = servers.aiohttp(app)
    summary, rows, run_dir = run_replay(make_trace(n=10, rate=50.0), [url], tmp_path,
                                        options=ReplayOptions(scrape_s=0.02))
    # asked once by the scraper and once by the server-side cross-check (replay.selfcheck), never again
    assert {r["status"] for r in rows} == {"ok"} and len(calls) == 2
    assert summary["client"]["server_check"]["available"] is False
    assert summary["scraped_metrics"] == [] and pq.read_table(run_dir / "series.parquet").num_rows == 0


class _OneAtATime(Policy):
    """Holds every request while one is in flight; rejects odd request ids."""

    name = "one_at_a_time"

    def __init__(self) -> None:
        self.queue: list[RouteRequest] = []

    def choose(self, req: RouteRequest, view: View) -> int:
        if req.request_id % 2:
            return REJECT
        if sum(view.outstanding_requests) == 0 and not self.queue:
            return 0
        self.queue.append(req)
        return HOLD

    def release(self, view: View):
        if self.queue and sum(view.outstanding_requests) == 0:
            return self.queue.pop(0), 0
        return None


def test_policy_rejections_and_held_requests_are_honoured(servers, tmp_path):  # noqa: F811
    url, cfg = servers.noop(NoopConfig(itl_s=0.005))
    _, rows, _ = run_replay(make_trace(n=10, rate=1000.0, output_tokens=4), [url], tmp_path, _OneAtATime())
    assert [r["status"] for r in rows] == ["ok", "rejected"] * 5
    assert sorted(cfg.records) == ["0", "2", "4", "6", "8"]  # rejected ones never reached the server
    sent = [r for r in rows if r["status"] == "ok"]
    for prev, nxt in zip(sent, sent[1:]):
        assert nxt["sent_s"] >= prev["last_token_s"]  # held until the previous one finished


# -- CLI -----------------------------------------------------------------------


def test_cli_replays_and_never_stores_the_api_key(servers, tmp_path, capsys, monkeypatch):  # noqa: F811
    seen = []

    async def models(request):
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"data": [{"id": "m"}]})

    async def chat(request):
        seen.append(request.headers.get("Authorization"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
        await resp.write(b'data: {"choices":[],"usage":{"completion_tokens":1,"prompt_tokens":3}}\n\ndata: [DONE]\n\n')
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    url = servers.aiohttp(app)
    trace = tmp_path / "t.parquet"
    write_trace(make_trace(n=3, rate=100.0), trace)
    monkeypatch.setenv("MY_KEY", "sk-secret-123")
    code, out, err = cli(["replay", str(trace), "-e", url, "--api-key-env", "MY_KEY", "--results",
                           str(tmp_path / "res"), "--run-id", "k", "--no-progress"], capsys)
    assert code == 0, err
    assert seen == ["Bearer sk-secret-123"] * 4
    for f in (tmp_path / "res" / "k").rglob("*"):
        assert f.is_dir() or b"sk-secret-123" not in f.read_bytes()
    assert "sk-secret-123" not in out + err


@pytest.mark.parametrize("args, fragment", [
    (["-e", "localhost:1"], "expected an http:// or https:// URL"),
    (["-e", "http://127.0.0.1:9"], "no endpoint answered"),
    (["-e", "http://127.0.0.1:9", "--api-key-env", "LLMLB_SURELY_UNSET"], "LLMLB_SURELY_UNSET is not set"),
    (["-e", "http://127.0.0.1:9", "--time-scale", "0"], "--time-scale"),
])
def test_cli_errors_are_one_line_and_write_nothing(tmp_path, capsys, args, fragment):
    trace = tmp_path / "t.parquet"
    write_trace(make_trace(n=2), trace)
    code, _, err = cli(["replay", str(trace), *args, "--results", str(tmp_path / "res")], capsys)
    assert code == 2
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and fragment in lines[0], err
    assert not (tmp_path / "res").exists()
