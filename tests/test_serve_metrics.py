"""``/metrics`` of ``llmlb serve``: valid Prometheus text under vLLM's names, gauges that follow the
batch, counters and histograms that add up to what was served."""

from __future__ import annotations

import json
import threading
import time

import pytest

from llmlb_bench.replay.prompts import PromptBuilder
from llmlb_bench.replay.scrape import parse_metrics
from llmlb_bench.serve import ServeOptions
from llmlb_bench.sim import ClusterConfig
from tests.serve_helpers import ServeThread, post_json, raw_socket, read_until, request

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client (test extra) parses the text")


def scrape(url: str) -> dict[str, dict]:
    """Families by name: ``{"type": ..., "samples": {(sample name, sorted labels minus the common ones): value}}``."""
    status, headers, raw = request(url, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    out = {}
    for fam in parser.text_string_to_metric_families(raw.decode()):
        samples = {}
        for s in fam.samples:
            assert s.labels["model_name"] == "llama-3-8b"
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))
            samples[(s.name, labels)] = s.value
        out[fam.name] = {"type": fam.type, "samples": samples}
    return out


def value(fams: dict, family: str, sample: str | None = None, **labels: str) -> float:
    return fams[family]["samples"][(sample or family, tuple(sorted(labels.items())))]


@pytest.fixture(scope="module")
def srv():
    st = ServeThread(ClusterConfig.build(replicas=1), ServeOptions(port_per_replica=0, speed=5.0))
    ended = []
    st.server.fleet.on_end = ended.append
    st.ended = ended
    yield st
    st.close()


def test_names_types_and_histogram_shape(srv):
    fams = scrape(srv.urls[0])
    types = {
        "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge",
        "vllm:cache_config_info": "gauge", "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
        "vllm:num_preemptions": "counter", "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter", "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram", "vllm:time_per_output_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram", "vllm:request_time_per_output_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram", "llmlb:token_lateness_seconds": "histogram",
    }
    for name, kind in types.items():
        assert fams[name]["type"] == kind, name
    info = next(iter(fams["vllm:cache_config_info"]["samples"]))
    assert dict(info[1])["num_gpu_blocks"] == str(srv.server.fleet.replicas[0].kv.total)
    sig = parse_metrics(request(srv.urls[0], "GET", "/metrics")[2].decode())   # the replayer's scraper
    assert (sig.waiting, sig.running, sig.kv_usage, sig.kv_blocks_total) == (
        0, 0, 0.0, srv.server.fleet.replicas[0].kv.total)


def test_gauges_follow_a_running_stream_and_token_counters_move_live(srv):
    url = srv.urls[0]
    body = json.dumps({"prompt": PromptBuilder(16).text(3000, [], 1), "max_tokens": 3000, "ignore_eos": True,
                       "stream": True}).encode()
    with raw_socket(url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        read_until(sock, b'"text"')
        a = scrape(url)
        time.sleep(0.3)
        b = scrape(url)
    assert value(a, "vllm:num_requests_running") == 1
    assert value(a, "vllm:kv_cache_usage_perc") > 0.0
    assert value(b, "vllm:kv_cache_usage_perc") > value(a, "vllm:kv_cache_usage_perc")   # the context grows
    assert 0 < value(a, "vllm:generation_tokens", "vllm:generation_tokens_total") < value(
        b, "vllm:generation_tokens", "vllm:generation_tokens_total")
    assert value(a, "vllm:prompt_tokens", "vllm:prompt_tokens_total") >= 3000
    assert value(a, "llmlb:simulated_time_seconds") < value(b, "llmlb:simulated_time_seconds")


def test_counters_and_histograms_add_up_to_what_was_served(srv):
    url = srv.urls[0]
    deadline = time.monotonic() + 120    # generous: the loop ends as soon as the stream is gone
    while value(scrape(url), "vllm:num_requests_running") and time.monotonic() < deadline:
        time.sleep(0.05)          # the stream the previous test cut is gone
    before = scrape(url)
    srv.ended.clear()
    builder = PromptBuilder(16)
    lengths = [(40 + 30 * i, 5 + 3 * i) for i in range(8)]
    threads = [threading.Thread(target=post_json, args=(url, "/v1/completions", {
        "prompt": builder.text(p, [], 100 + i), "max_tokens": o, "ignore_eos": True}))
        for i, (p, o) in enumerate(lengths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = scrape(url)

    def delta(family: str, sample: str | None = None, **labels: str) -> float:
        return value(after, family, sample, **labels) - value(before, family, sample, **labels)

    assert delta("vllm:request_success", "vllm:request_success_total", finished_reason="length") == 8
    assert delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") == sum(p for p, _ in lengths)
    assert delta("vllm:generation_tokens", "vllm:generation_tokens_total") == sum(o for _, o in lengths)
    lives = list(srv.ended)
    assert len(lives) == 8
    ttft = "vllm:time_to_first_token_seconds"
    assert delta(ttft, ttft + "_count") == 8
    assert delta(ttft, ttft + "_sum") == pytest.approx(sum(x.first_token_s - x.arrival_s for x in lives))
    itl = "vllm:inter_token_latency_seconds"
    assert delta(itl, itl + "_count") == sum(o - 1 for _, o in lengths)
    assert delta(itl, itl + "_sum") == pytest.approx(sum(x.last_token_s - x.first_token_s for x in lives))
    e2e = "vllm:e2e_request_latency_seconds"
    assert delta(e2e, e2e + "_sum") == pytest.approx(sum(x.last_token_s - x.arrival_s for x in lives))
    for name in (ttft, itl, e2e, "vllm:request_prompt_tokens"):
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in after[name]["samples"].items()
                         if k[0] == name + "_bucket")
        counts = [v for _, v in buckets]
        assert counts == sorted(counts) and counts[-1] == value(after, name, name + "_count")
