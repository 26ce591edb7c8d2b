"""Reading engines' Prometheus text: vLLM's current (V1 engine) names, as the CPU build publishes them.

The sample lines are copied from a real vLLM 0.32 ``/metrics`` answer (tests/test_replay_vllm.py
checks the same against a live server); two engine label sets are summed, as for data parallelism.
"""

from __future__ import annotations

from llmlb_bench.replay.scrape import counter_delta, parse_metrics

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 4.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:num_preemptions_total{engine="0",model_name="tiny"} 7.0
vllm:num_preemptions_total{engine="1",model_name="tiny"} 4.0
vllm:num_preemptions_created{engine="0",model_name="tiny"} 1.7961240031659472e+09
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",engine="0",num_gpu_blocks="40",num_gpu_blocks_override="40"} 1.0
"""


def test_vllm_v1_gauges_counters_and_block_count():
    sig = parse_metrics(VLLM)
    assert (sig.running, sig.waiting, sig.kv_usage) == (5, 4, 0.25)  # summed over engines; KV a 0-1 fraction
    assert sig.kv_blocks_total == 40 and sig.preemptions_total == 11.0  # _created lines are not the counter


def test_counter_deltas_between_scrapes():
    assert counter_delta(None, 11.0) is None and counter_delta(11.0, None) is None  # the first scrape: no delta
    assert counter_delta(11.0, 11.0) == 0 and counter_delta(11.0, 14.0) == 3
    assert counter_delta(14.0, 2.0) == 2  # the engine restarted: its counter began again at 0


def test_series_rows_turn_scrapes_into_series_columns():
    """One row per scrape: KV blocks used from the fraction and the block count, preemptions as
    the increase since the same target's previous scrape (none at a target's first)."""
    from llmlb_bench.replay.scrape import SeriesRows, Signals
    series = SeriesRows()
    series.add(0.0, "a", Signals(waiting=2, running=3, kv_usage=0.25, kv_blocks_total=40, counters={"preemptions": 7.0,
                                                                                        "spec_drafts": 5.0}))
    series.add(0.0, "b", Signals(waiting=0, running=1))
    series.add(1.0, "a", Signals(waiting=1, running=4, kv_usage=0.5, kv_blocks_total=40, counters={"preemptions": 9.0,
                                                                                        "spec_drafts": 8.0}))
    rows = series.take()
    assert rows == {"t_s": [0.0, 0.0, 1.0], "target": ["a", "b", "a"], "waiting": [2, 0, 1], "running": [3, 1, 4],
                    "kv_blocks_used": [10, None, 20], "kv_blocks_total": [40, None, 40],
                    "preemptions": [None, None, 2], "spec_drafts": [None, None, 3],
                    "spec_draft_tokens": [None] * 3, "spec_accepted_tokens": [None] * 3}
    assert series.take() is None


def test_speculative_decoding_counters_are_read():
    """vLLM V1's spec-decode counters, summed over engines; per-position samples are not totals."""
    from llmlb_bench.replay.scrape import parse_metrics
    text = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="tiny"} 2.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 48.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 13.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 9.0
"""
    sig = parse_metrics(text)
    assert sig.counters == {"spec_drafts": 12.0, "spec_draft_tokens": 48.0, "spec_accepted_tokens": 13.0}
    assert sig.preemptions_total is None
