"""The replayer against a real third-party engine: upstream llama.cpp ``llama-server`` on CPU.

The model is a tiny random-weight LLaMA the test writes itself
(llmlb_bench.engines.llama: one ASCII character per token, only letters
sampled). The binary is built once by scripts/build_llama_server.sh (about
7.5 minutes on 2 cores; scripts/test.sh runs it) into a cache outside the
checkout; without it (or without the ``gguf`` package) the test fails where
``CI`` is set and skips elsewhere, saying how to get it (engines_helpers).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from engines_helpers import llama_server_binary, require_module
from replay_helpers import run_replay, token_count

from llmlb_bench.engines.llama import LlamaServer, write_tiny_llama
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.pypi_routers.launch import free_ports
from llmlb_bench.schema import TRACE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama_url(tmp_path_factory):
    binary = llama_server_binary()
    require_module("gguf", "the tiny test model is written with the gguf package")
    model = write_tiny_llama(tmp_path_factory.mktemp("llama") / "tiny.gguf", n_embd=256, n_layer=4, n_head=8,
                             n_head_kv=4, n_ff=512)
    with LlamaServer(binary, model, free_ports(1)[0]) as server:
        yield server.url


def _trace(n: int, seed: int = 3) -> pa.Table:
    """Poisson arrivals at 40/s; half the prompts share a 2-block system prefix."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / 40, n))
    inputs = rng.integers(40, 300, n)
    hashes = [([1, 2] if i % 2 == 0 else []) + [1000 * (i + 1) + k for k in range(int(inputs[i]) // 16)]
              for i in range(n)]
    return TRACE.conform(pa.table({
        "request_id": pa.array(np.arange(n), pa.int64()), "arrival_s": arrivals - arrivals[0],
        "input_tokens": pa.array(inputs, pa.int32()), "output_tokens": pa.array(rng.integers(8, 48, n), pa.int32()),
        "prefix_hashes": pa.array(hashes, pa.list_(pa.uint64()))}), "t")


def test_streamed_concurrent_replay_is_accounted_exactly(llama_url, tmp_path):
    trace = _trace(32)
    summary, rows, run_dir = run_replay(trace, [llama_url], tmp_path,
                                        options=ReplayOptions(api="completions", tokenize=True, scrape_s=0.1))
    assert summary["statuses"] == {"ok": 32}, [r["error"] for r in rows if r["error"]]
    wanted_out = trace.column("output_tokens").to_pylist()
    wanted_in = trace.column("input_tokens").to_pylist()
    for r, out, inp in zip(rows, wanted_out, wanted_in):
        assert r["output_tokens"] == out and not r["output_tokens_estimated"]  # usage, ignore_eos honoured
        assert token_count(r) == out  # one SSE chunk per token
        assert r["server_input_tokens"] == inp  # exact prompt lengths through /tokenize
        assert r["sent_s"] < r["first_token_s"] <= r["last_token_s"] and r["cached_tokens"] is not None
    # the engine's prefix cache saw the trace's sharing, and no more: only the 32-token prefix
    # that even-numbered requests share can be cached (beyond a few tokens of chance agreement)
    shared_repeats = sum(1 for r in rows if r["request_id"] % 2 == 0) - 1
    cached = sum(r["cached_tokens"] for r in rows)
    assert 0 < cached <= 32 * shared_repeats + 4 * len(rows)
    # the engine really ran requests concurrently (continuous batching over its slots)
    events = sorted([(r["sent_s"], 1) for r in rows] + [(r["last_token_s"], -1) for r in rows])
    assert max(np.cumsum([d for _, d in events])) >= 3
    # and said so on /metrics (llamacpp:requests_processing), scraped into series.parquet
    series = pq.read_table(run_dir / "series.parquet").to_pylist()
    assert summary["scraped_metrics"] == [llama_url] and max(r["running"] for r in series) >= 1


def test_chat_api_through_the_engines_template(llama_url, tmp_path):
    _, rows, _ = run_replay(_trace(4), [llama_url], tmp_path, options=ReplayOptions(api="chat"))
    assert all(r["status"] == "ok" and r["output_tokens"] == r["requested_output_tokens"] for r in rows)
    # the chat template wraps the prompt, so the server counts more tokens than the words sent
    assert all(r["server_input_tokens"] > r["input_tokens"] for r in rows)
