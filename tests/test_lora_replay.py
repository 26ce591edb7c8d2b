"""LoRA through the replayer and ``llmlb serve``: the adapter is the request's model, rows record it,
the serving replica's adapter slots show in its /metrics, the scraper reads them into the view."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmlb_bench.policies.lora import salted
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.replay.scrape import LoraInfo, parse_metrics
from llmlb_bench.serve import ServeOptions
from llmlb_bench.sim import ClusterConfig
from tests.replay_helpers import run_replay
from tests.serve_helpers import ServeThread, request
from tests.sim_helpers import trace


def test_the_scraper_takes_the_newest_lora_label_set():
    # vLLM keeps every label set it ever set; the value is when it was set
    text = ('# TYPE vllm:lora_requests_info gauge\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a1",waiting_lora_adapters=""} 1.7e9\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a1,a2",waiting_lora_adapters="a3"} 1.8e9\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.6e9\n'
            'vllm:num_requests_running{model_name="m"} 2\n')
    sig = parse_metrics(text)
    assert sig.lora == LoraInfo(2, frozenset({"a1", "a2"}), frozenset({"a3"}))
    assert sig.running == 2
    assert parse_metrics('vllm:num_requests_running{model_name="m"} 2\n').lora is None


def test_replay_sends_the_adapter_as_the_model_and_records_it(tmp_path: Path):
    cfg = ClusterConfig.build(replicas=2, max_loras=1)
    st = ServeThread(cfg, ServeOptions(port_per_replica=0, speed=10.0, lora_modules=("a", "b")))
    try:
        _, _, raw = request(st.urls[0], "GET", "/v1/models")
        listed = {m["id"]: m["parent"] for m in json.loads(raw)["data"]}
        assert listed == {"llama-3-8b": None, "a": "llama-3-8b", "b": "llama-3-8b"}
        adapters = ["a", "b", None, "a", "zzz", "b"]
        table = trace(np.arange(6) * 0.05, 64, 8, adapter=pa.array(adapters))
        _, rows, _ = run_replay(table, st.urls, tmp_path, "round_robin", ReplayOptions(time_scale=0.1))
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
