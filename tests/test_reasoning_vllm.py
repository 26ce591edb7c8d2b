"""Replay's reasoning accounting against real vLLM (its CPU build) with ``--reasoning-parser deepseek_r1``.

The tiny random model carries ``<think>``/``</think>`` (engines/tiny_hf.py) and the think-tag
logits processor (engines/think_tags.py) forces ``</think>`` as output token R + 1 of a request
sent with ``vllm_xargs.reasoning_tokens`` = R (what the replayer sends for a trace row with R
reasoning tokens; 0 without it). vLLM then streams R ``reasoning`` deltas, no chunk for the tag,
and the answer as ``content``: the replayer must count R and time the first answer at chunk R + 1. One vLLM
replica for the module, found through engines_helpers.vllm_python (a failure where ``CI`` is set).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from engines_helpers import require_module, vllm_python
from replay_helpers import run_replay, token_count

from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.schema import TOKEN_SEGMENT
from llmlb_bench.sim.timeline import nth_token_times
from llmlb_bench.store.views import Catalog
from sim_helpers import trace

pytestmark = pytest.mark.slow

OUTPUT = 40
REASONING = [25, 0, 10, 39, 1, 0, 30, 5]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    python = vllm_python()
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    model = write_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny")
    with VllmReplicas(model, 1, settings=VllmSettings(reasoning=True, max_model_len=1024), python=python,
                      log_dir=tmp_path_factory.mktemp("vllm-logs")) as fleet:
        yield fleet.urls[0]


def test_reasoning_chunks_and_first_answer_as_the_processor_forced_them(engine, tmp_path):
    n = len(REASONING)
    table = trace(np.arange(n) * 0.2, 60, OUTPUT, reasoning_tokens=pa.array(REASONING, pa.int32()))
    # usage in every chunk: an API server that falls behind its engine bundles several tokens into one
    # delta (seen here under load: 27 reasoning chunks for 30 tokens); the chunks' usage still counts each
    chunk_usage = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    _, rows, run_dir = run_replay(table, [engine], tmp_path, options=ReplayOptions(scrape_s=None,
                                                                                  extra_body=chunk_usage))
    assert [r["status"] for r in rows] == ["ok"] * n
    assert all(r["output_tokens"] == OUTPUT and not r["output_tokens_estimated"] for r in rows)
    # vLLM streams R reasoning tokens, then the answer; the </think> tag streams no text but its token
    # counts with the next chunk's usage (a row without reasoning gets </think> first)
    assert [r["reasoning_tokens"] for r in rows] == [r or None for r in REASONING]
    assert [token_count(r) for r in rows] == [OUTPUT] * n
    tt = pa.array([r["token_times"] for r in rows], pa.list_(TOKEN_SEGMENT))
    chunk = nth_token_times(tt, np.array(REASONING) + 1)
    for r, at in zip(rows, chunk):
        if r["reasoning_tokens"] and r["reasoning_tokens"] < OUTPUT - 1:
            assert r["first_answer_s"] == at > r["first_token_s"]
        else:   # no reasoning, or reasoning then </think> as the last token: no answer
            assert r["first_answer_s"] is None
    [s] = summarize(Catalog([run_dir]), Slo.parse("ttfa=30s"))
    assert s["reasoning"]["tokens"] == sum(REASONING) and s["reasoning"]["requests"] == 6
    assert s["slo"]["good"] == n - 1     # the row that never answered has no TTFA
