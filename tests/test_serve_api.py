"""``llmlb serve`` over real HTTP on 127.0.0.1: endpoints, formats, output lengths, errors, HTTP/1.1
mechanics, disconnects, prefix caching."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from llmlb_bench.replay.media import png_data_url, wav_base64
from llmlb_bench.replay.prompts import PromptBuilder
from llmlb_bench.serve import ServeOptions
from llmlb_bench.serve.tokenizer import encode
from llmlb_bench.sim import ClusterConfig
from tests.serve_helpers import ServeThread, post_json, raw_socket, read_until, request, sse_events

PROMPT = PromptBuilder(16).text(100, [11, 22, 33], 5)   # 100 tokens, as the replayer writes them


@pytest.fixture(scope="module")
def srv():
    st = ServeThread(ClusterConfig.build(replicas=1), ServeOptions(port_per_replica=0, speed=50.0, mean_output_tokens=20))
    yield st
    st.close()


@pytest.fixture(scope="module")
def url(srv) -> str:
    return srv.urls[0]


def test_models_health_version_tokenize(url):
    status, _, raw = request(url, "GET", "/v1/models")
    models = json.loads(raw)
    assert status == 200 and [m["id"] for m in models["data"]] == ["llama-3-8b"]
    assert models["data"][0]["max_model_len"] == 8192
    assert request(url, "GET", "/health")[0] == 200
    assert json.loads(request(url, "GET", "/version")[2])["server"] == "llmlb serve"
    status, tok = post_json(url, "/tokenize", {"model": "llama-3-8b", "prompt": PROMPT})
    assert status == 200 and tok["count"] == 100 == len(tok["tokens"]) and tok["max_model_len"] == 8192
    assert post_json(url, "/tokenize", {"content": PROMPT})[1]["tokens"] == tok["tokens"]      # llama.cpp style
    msgs = {"messages": [{"role": "user", "content": PROMPT}]}
    assert post_json(url, "/tokenize", msgs)[1]["count"] == 100


def test_streamed_completion_has_one_chunk_per_token_then_usage(url):
    status, headers, raw = request(url, "POST", "/v1/completions", {
        "model": "llama-3-8b", "prompt": PROMPT, "max_tokens": 30, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert headers["transfer-encoding"] == "chunked"
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    tokens = [e for e in events[:-1] if e["choices"]]
    assert len(tokens) == 30 and all(e["object"] == "text_completion" for e in tokens)
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * 29 + ["length"]
    usage = events[-2]["usage"]
    assert events[-2]["choices"] == []
    assert usage == {"prompt_tokens": 100, "completion_tokens": 30, "total_tokens": 130,
                     "prompt_tokens_details": {"cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]}}
    text = "".join(e["choices"][0]["text"] for e in tokens)
    assert len(encode(text)) == 30


def test_streamed_chat_starts_with_the_role_and_no_usage_unless_asked(url):
    status, _, raw = request(url, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": 12, "min_tokens": 12,
        "stream": True})
    events = sse_events(raw)
    assert status == 200 and events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [e for e in events[1:-1]]
    assert len(content) == 12 and all(e["object"] == "chat.completion.chunk" for e in content)
    assert all(e["choices"][0]["delta"]["content"] for e in content)
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert not any("usage" in e for e in events[:-1])


def test_whole_completions_and_chats(url):
    status, body = post_json(url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 9, "ignore_eos": True})
    assert status == 200 and body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 9 == len(encode(body["choices"][0]["text"]))
    status, body = post_json(url, "/v1/chat/completions", {
        "messages": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": [
            {"type": "text", "text": PROMPT}, {"type": "image_url", "image_url": {"url": png_data_url(84, 1)}},
            {"type": "input_audio", "input_audio": {"data": wav_base64(0.4, 1), "format": "wav"}}]}],
        "max_tokens": 5, "ignore_eos": True})
    assert status == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    # "Be brief", the newline between messages, the prompt, a 3 x 3 image (28 px a token), 0.4 s of audio
    assert body["usage"]["prompt_tokens"] == 2 + 1 + 100 + 9 + 10
    assert len(encode(body["choices"][0]["message"]["content"])) == 5
    bad = {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "eA=="}}]}]}
    assert post_json(url, "/v1/chat/completions", bad)[0] == 400


def test_free_lengths_are_geometric_deterministic_and_bounded(url):
    """Without ignore_eos a length is a geometric draw (mean 20 here), seeded by the prompt."""
    builder = PromptBuilder(16)
    lengths = []
    for i in range(200):
        status, body = post_json(url, "/v1/completions", {"prompt": builder.text(30, [], i), "max_tokens": 1000})
        assert status == 200
        lengths.append(body["usage"]["completion_tokens"])
        assert body["choices"][0]["finish_reason"] == "stop"
    lengths = np.array(lengths)
    # mean of 200 geometric draws with mean 20: standard error sqrt(20 * 19 / 200) = 1.38
    assert abs(lengths.mean() - 20) < 4.5
    assert lengths.min() >= 1 and np.mean(lengths == 1) == pytest.approx(1 / 20, abs=0.04)
    again = post_json(url, "/v1/completions", {"prompt": builder.text(30, [], 7), "max_tokens": 1000})[1]
    first = post_json(url, "/v1/completions", {"prompt": builder.text(30, [], 7), "max_tokens": 1000})[1]
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    capped = [post_json(url, "/v1/completions", {"prompt": builder.text(30, [], i), "max_tokens": 3})[1]
              for i in range(20)]
    assert all(c["usage"]["completion_tokens"] <= 3 for c in capped)
    assert {c["choices"][0]["finish_reason"] for c in capped} == {"stop", "length"}
    raised = [post_json(url, "/v1/completions", {"prompt": builder.text(30, [], i), "max_tokens": 100,
                                                  "min_tokens": 40})[1] for i in range(20)]
    assert all(40 <= c["usage"]["completion_tokens"] <= 100 for c in raised)


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", {"model": "gpt-9", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 9000}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", {"prompt": "x", "min_tokens": 5, "max_tokens": 2}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/completions", {"prompt": " the" * 8200}, 400, "prompt"),
])
def test_invalid_requests_get_openai_errors(url, path, body, status, param):
    got, _, raw = request(url, "POST", path, body)
    err = json.loads(raw)["error"]
    assert got == status == err["code"] and err["message"]
    assert err["param"] == param


def test_unknown_paths_and_methods(url):
    assert request(url, "GET", "/v2/nothing")[0] == 404
    assert request(url, "GET", "/v1/completions")[0] == 405
    assert request(url, "POST", "/metrics", {})[0] == 405


def test_keep_alive_pipelining_expect_continue_and_http10(url):
    body = json.dumps({"prompt": "hi the", "max_tokens": 2, "ignore_eos": True}).encode()
    one = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with raw_socket(url) as sock:
        sock.sendall(one + one + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = read_until(sock, b"\r\n\r\n", 1 << 20)
        while True:
            more = sock.recv(65536)
            if not more:
                break
            data += more
    heads = data.split(b"HTTP/1.1 ")[1:]
    assert [h[:3] for h in heads] == [b"200"] * 3
    ids = [json.loads(h.split(b"\r\n\r\n", 1)[1])["id"] for h in heads[:2]]
    assert int(ids[0].split("-")[1]) + 1 == int(ids[1].split("-")[1])   # answered in order
    with raw_socket(url) as sock:
        sock.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 19\r\n\r\n")
        assert read_until(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(b'{"prompt": "a b c"}')
        assert b'"count": 3' in read_until(sock, b"}")
    stream = json.dumps({"prompt": "hi", "max_tokens": 3, "ignore_eos": True, "stream": True}).encode()
    with raw_socket(url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s" % (len(stream), stream))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, body10 = data.split(b"\r\n\r\n", 1)
    assert b"Connection: close" in head and b"Transfer-Encoding" not in head
    assert body10.endswith(b"data: [DONE]\n\n") and body10.count(b'"text"') == 3
    with raw_socket(url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        assert read_until(sock, b"}").startswith(b"HTTP/1.1 411")


def test_a_client_disconnect_aborts_the_request(srv, url):
    fleet = srv.server.fleet
    before = srv.call(lambda: fleet.states[0].metrics.aborted)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 4000, "ignore_eos": True, "stream": True}).encode()
    with raw_socket(url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert b'"text"' in read_until(sock, b'"text"')
    deadline = time.monotonic() + 120    # generous: the loop ends as soon as the abort is seen
    while srv.call(lambda: fleet.states[0].metrics.aborted) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.call(lambda: (fleet.states[0].metrics.aborted, len(fleet.replicas[0].running))) == (before + 1, 0)


def test_shared_prompt_prefixes_hit_the_prefix_cache(url):
    prompt = PromptBuilder(16).text(160, [777 + k for k in range(10)], 1)
    first = post_json(url, "/v1/completions", {"prompt": prompt, "max_tokens": 1})[1]
    again = post_json(url, "/v1/completions", {"prompt": prompt, "max_tokens": 1})[1]
    # 160 prompt tokens = 10 blocks; at least one token is always computed, so 9 blocks come from the cache
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 144
    other = PromptBuilder(16).text(160, [777 + k for k in range(4)], 2)   # shares 4 blocks
    assert post_json(url, "/v1/completions", {"prompt": other, "max_tokens": 1})[1][
        "usage"]["prompt_tokens_details"]["cached_tokens"] == 64


def test_one_routed_port_spreads_requests_over_the_replicas():
    from llmlb_bench.policies import make_policy

    st = ServeThread(ClusterConfig.build(replicas=3), ServeOptions(port=0, speed=50.0), make_policy("round_robin"))
    try:
        assert len(st.urls) == 1
        for _ in range(6):
            assert post_json(st.urls[0], "/v1/completions", {"prompt": "a b", "max_tokens": 4,
                                                             "ignore_eos": True})[0] == 200
        done = st.call(lambda: [sum(s.metrics.success.values()) for s in st.server.fleet.states])
        assert done == [2, 2, 2]
    finally:
        st.close()


def test_a_cache_aware_router_sends_a_repeated_prompt_where_it_is_cached():
    """The routed port gives policies the prompt's block hashes, so SGLang's cache_aware policy
    follows the prefix: five repeats of a long prompt hit the replica that computed it."""
    from llmlb_bench.policies import make_policy

    st = ServeThread(ClusterConfig.build(replicas=3), ServeOptions(port=0, speed=50.0), make_policy("cache_aware"))
    prompt = PromptBuilder(16).text(800, list(range(50)), 3)
    try:
        cached = [post_json(st.urls[0], "/v1/completions", {"prompt": prompt, "max_tokens": 2})[1]["usage"][
            "prompt_tokens_details"]["cached_tokens"] for _ in range(6)]
        done = st.call(lambda: sorted(sum(s.metrics.success.values()) for s in st.server.fleet.states))
    finally:
        st.close()
    assert cached == [0] + [784] * 5 and done == [0, 0, 6]
