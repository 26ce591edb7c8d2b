"""Reasoning on the wire: ``llmlb replay`` against ``llmlb serve`` (vLLM's ``reasoning`` deltas) and against
a DeepSeek-style stream (``reasoning_content``, the usage's reasoning count), all on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from aiohttp import web

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.schema import TOKEN_SEGMENT
from llmlb_bench.serve import ServeOptions
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.timeline import nth_token_times
from llmlb_bench.store.views import Catalog
from tests.replay_helpers import run_replay, servers, token_count  # noqa: F401 (fixture)
from tests.serve_helpers import ServeThread, post_json, request, sse_events
from tests.sim_helpers import trace

REASONING = [30, 0, 12, 40, 0, 25]


def test_replay_through_serve_separates_reasoning_from_the_answer(tmp_path: Path):
    """The replayer tells the server each row's reasoning (vllm_xargs.reasoning_tokens), the server
    streams that many ``reasoning`` deltas, and the replayer counts them back exactly and times the
    first answer chunk: the stream's token number reasoning + 1."""
    n = len(REASONING)
    table = trace(np.arange(n) * 0.05, 200, 40, reasoning_tokens=pa.array(REASONING, pa.int32()))
    st = ServeThread(ClusterConfig.build(replicas=1), ServeOptions(port_per_replica=0, speed=10.0))
    try:
        _, rows, run_dir = run_replay(table, st.urls, tmp_path, "round_robin", ReplayOptions(scrape_s=None))
    finally:
        st.close()
    assert [r["status"] for r in rows] == ["ok"] * n
    assert [r["reasoning_tokens"] for r in rows] == [r or None for r in REASONING]
    assert all(r["output_tokens"] == token_count(r) == 40 for r in rows)
    tt = pa.array([r["token_times"] for r in rows], pa.list_(TOKEN_SEGMENT))
    expected = nth_token_times(tt, np.array(REASONING) + 1)
    for r, want in zip(rows, expected):
        if r["reasoning_tokens"] and r["reasoning_tokens"] < 40:
            assert r["first_answer_s"] == want > r["first_token_s"]
        else:
            assert r["first_answer_s"] is None     # no reasoning, or nothing but reasoning (row 3)
    [s] = summarize(Catalog([run_dir]), Slo.parse("ttfa=10s"))
    assert s["reasoning"]["tokens"] == sum(REASONING) and s["reasoning"]["requests"] == 4
    assert s["reasoning"]["share"] == pytest.approx(sum(REASONING) / (40 * n))
    assert s["reasoning"]["ttfa"]["n"] == n - 1                # row 3 never answered: no TTFA, not good
    assert s["slo"]["good"] == n - 1


def test_serve_streams_vllm_reasoning_deltas_and_whole_replies():
    st = ServeThread(ClusterConfig.build(replicas=1), ServeOptions(port_per_replica=0, speed=50.0))
    try:
        body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6, "min_tokens": 6,
                "ignore_eos": True, "vllm_xargs": {"reasoning_tokens": 4}}
        status, _, raw = request(st.urls[0], "POST", "/v1/chat/completions", {**body, "stream": True})
        deltas = [e["choices"][0]["delta"] for e in sse_events(raw) if isinstance(e, dict) and e.get("choices")]
        kinds = [k for d in deltas for k in ("reasoning", "content") if d.get(k)]
        assert status == 200 and kinds == ["reasoning"] * 4 + ["content"] * 2
        status, reply = post_json(st.urls[0], "/v1/chat/completions", body)
        message = reply["choices"][0]["message"]
        assert len(message["reasoning"].split()) == 4 and len(message["content"].split()) == 2
        status, reply = post_json(st.urls[0], "/v1/chat/completions", {**body, "vllm_xargs": {"reasoning_tokens": -1}})
        assert status == 400 and "reasoning_tokens" in reply["error"]["message"]
    finally:
        st.close()


def test_deepseek_style_reasoning_content_and_usage_count(servers, tmp_path: Path):  # noqa: F811
    """``reasoning_content`` deltas (DeepSeek, SGLang) count as reasoning; the usage's
    ``completion_tokens_details.reasoning_tokens`` wins over the chunk count when positive; the first
    chunk with content is the first answer token, even when it also closes the reasoning."""
    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        report = request.headers.get("X-Request-Id") == "1"    # the second request's usage counts reasoning

        async def send(delta: dict, finish: str | None = None) -> None:
            chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        for k in range(3):
            await send({"reasoning_content": f" step{k}", "content": None})
        await send({"reasoning_content": " done", "content": " The"})
        await send({"content": " answer"}, "stop")
        # vLLM 0.32 sends reasoning_tokens 0 after streaming reasoning deltas: the chunks count then
        usage = {"prompt_tokens": 5, "completion_tokens": 7,
                 "completion_tokens_details": {"reasoning_tokens": 4 if report else 0}}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    url = servers.aiohttp(app)
    table = trace(np.array([0.0, 0.01]), 10, 7)
    _, rows, _ = run_replay(table, [url], tmp_path, "round_robin", ReplayOptions(scrape_s=None, tokenize=False))
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert [r["reasoning_tokens"] for r in rows] == [3, 4]    # the chunk count; the usage's 4
    for r in rows:
        times = [s["start_s"] for s in r["token_times"] for _ in range(s["count"])]
        assert r["first_answer_s"] == times[3]               # the 4th chunk carries the first content
