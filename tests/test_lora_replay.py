"""LoRA through the replayer, ``llmlb serve`` and ``llmlb route``: the adapter is the request's model,
rows record it, the serving replica's adapter slots show in its /metrics, the scraper reads them into
the view, and the proxy routes by its own books of adapters in flight."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from llmlb_bench.policies import make_policy
from llmlb_bench.policies.lora import AdapterSnapshot, salted
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.replay.scrape import parse_metrics
from llmlb_bench.proxy import RouteOptions, RouteProxy
from llmlb_bench.serve import ServeOptions
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.store import RunStore
from tests.conftest import cli
from tests.replay_helpers import ServerThread, run_replay
from tests.serve_helpers import ServeThread, request
from tests.sim_helpers import trace
from tests.test_proxy import rows_of


def test_the_scraper_takes_the_newest_lora_label_set():
    # vLLM keeps every label set it ever set; the value is when it was set
    text = ('# TYPE vllm:lora_requests_info gauge\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a1",waiting_lora_adapters=""} 1.7e9\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a1,a2",waiting_lora_adapters="a3"} 1.8e9\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.6e9\n'
            'vllm:num_requests_running{model_name="m"} 2\n')
    sig = parse_metrics(text)
    assert sig.lora == AdapterSnapshot(2, frozenset({"a1", "a2"}), frozenset({"a3"}))
    assert sig.running == 2
    assert parse_metrics('vllm:num_requests_running{model_name="m"} 2\n').lora is None


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_replay_sends_the_adapter_as_the_model_and_records_it(tmp_path: Path, api: str):
    cfg = ClusterConfig.build(replicas=2, max_loras=1)
    st = ServeThread(cfg, ServeOptions(port_per_replica=0, speed=10.0, lora_modules=("a", "b")))
    try:
        _, _, raw = request(st.urls[0], "GET", "/v1/models")
        listed = {m["id"]: m["parent"] for m in json.loads(raw)["data"]}
        assert listed == {"llama-3-8b": None, "a": "llama-3-8b", "b": "llama-3-8b"}
        adapters = ["a", "b", None, "a", "zzz", "b"]
        table = trace(np.arange(6) * 0.05, 64, 8, adapter=pa.array(adapters))
        _, rows, _ = run_replay(table, st.urls, tmp_path, "round_robin", ReplayOptions(time_scale=0.1, api=api))
        assert [r["adapter"] for r in rows] == adapters
        # the server knew every name but the one it does not serve: 404, as vLLM answers
        assert [r["status"] for r in rows] == ["ok", "ok", "ok", "ok", "error", "ok"]
        assert rows[4]["http_status"] == 404
        # both replicas served adapters; their slots hold the last one each ran
        for url in st.urls:
            sig = parse_metrics(request(url, "GET", "/metrics")[2].decode())
            assert sig.lora is not None and sig.lora.max_loras == 1 and not sig.lora.running
        loads = [rep.lora.loads for rep in st.server.fleet.replicas]
        assert sum(loads) >= 2 and all(loads)
    finally:
        st.close()


def test_prefix_hashes_are_salted_per_adapter():
    # the same prompt under two adapters shares no block; under one adapter, all of them
    hashes = [1, 2, 3]
    assert salted(hashes, None) == hashes
    assert set(salted(hashes, "a")).isdisjoint(salted(hashes, "b"))
    assert salted(hashes, "a") == salted(hashes, "a")


def test_llmlb_route_routes_adapters_by_affinity_from_its_own_books(tmp_path: Path):
    """``llmlb route`` in front of two ``llmlb serve`` replicas serving adapters: it learns the
    adapters from /v1/models, records them, and keeps a's requests together while one is in flight."""

    serve = ServeThread(ClusterConfig.build(replicas=2, max_loras=1), ServeOptions(port_per_replica=0, speed=1.0,
                                                                                    lora_modules=("a", "b")))
    st = ServerThread()
    try:
        with RunStore(tmp_path, config={}, backend="route", run_id="r") as run:
            async def go() -> RouteProxy:
                return await RouteProxy(serve.urls, make_policy("lora_affinity"), run,
                                        RouteOptions(port=0, scrape_s=0.1)).start()
            proxy = st.call(go)
            assert proxy.lora_models == {"a", "b"}
            body = {"prompt": "x y z", "max_tokens": 200, "min_tokens": 200, "stream": True}
            def reached(n: int) -> None:
                """Wait until the engines have received ``n`` requests (the run's own progress, not a
                fixed pause: a loaded machine took longer than one to send a request on)."""
                while serve.call(lambda: serve.server.fleet._seq) < n:
                    time.sleep(0.01)

            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                long_a = pool.submit(request, proxy.url, "POST", "/v1/completions", {**body, "model": "a"})
                reached(1)
                # a is in flight on one backend: the second a joins it, b goes to the other
                short_a = pool.submit(request, proxy.url, "POST", "/v1/completions", {**body, "model": "a",
                                                                                      "max_tokens": 5, "min_tokens": 5})
                reached(2)
                short_b = pool.submit(request, proxy.url, "POST", "/v1/completions", {**body, "model": "b",
                                                                                      "max_tokens": 5, "min_tokens": 5})
                assert all(f.result()[0] == 200 for f in (long_a, short_a, short_b))
            st.call(proxy.drain)
        rows = rows_of(run.dir)
        assert [r["adapter"] for r in rows] == ["a", "a", "b"]
        assert rows[0]["target"] == rows[1]["target"] != rows[2]["target"]
        assert all(not books.running for books in proxy.own_adapters)   # every request ended
    finally:
        st.close()
        serve.close()


@pytest.mark.parametrize("args, problem", [
    (["engine", "vllm", "--lora", "a1=/nonexistent/adapter"], "--lora: /nonexistent/adapter: not a PEFT adapter folder"),
    (["engine", "vllm", "--lora", "a1", "--lora", "a1"], "--lora: adapter 'a1' given twice"),
    (["engine", "vllm", "--lora", "a1", "--model", "/tmp"], "--lora: give a1=DIR"),
    (["serve", "--lora-modules", "a1", "--replicas", "1"], "--lora-modules: LoRA adapters need adapter slots"),
])
def test_bad_lora_flags_are_one_line_errors_before_anything_starts(args, problem, capsys):
    code, _, err = cli(args, capsys)
    assert code == 2 and problem in err and len(err.strip().splitlines()) == 1
