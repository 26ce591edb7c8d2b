"""The Prometheus text format through prometheus_client, both ways: what llmlb serve exposes
reads back through the replayer's parser, and a malformed line costs only that line."""

from __future__ import annotations

import asyncio

from llmlb_bench.policies import make_policy
from llmlb_bench.replay.scrape import metric_lines, parse_metrics
from llmlb_bench.serve.live import LiveFleet, Submission
from llmlb_bench.serve.metrics import render
from llmlb_bench.sim import ClusterConfig


class _Quiet:
    def on_start(self, live): ...
    def on_tokens(self, live, count): ...
    def on_finish(self, live, count): ...
    def on_reject(self, live, message): ...


def test_served_metrics_parse_back_to_the_fleet_state():
    async def go():
        fleet = LiveFleet(ClusterConfig.build(replicas=2, max_num_seqs=1), policy=make_policy("round_robin"),
                          clock=lambda: 0.0)                     # a frozen clock: nothing finishes
        for _ in range(5):
            fleet.submit(Submission(100, 50, (), stream=False), _Quiet())
        text = render(fleet, [0, 1], 'model "x"')
        fleet.close()
        return fleet, text
    fleet, text = asyncio.run(go())
    sig = parse_metrics(text)
    assert sig.running == 2 and sig.waiting == 3                 # one seat per replica
    assert sig.kv_blocks_total == sum(r.kv.total for r in fleet.replicas)
    assert 0 < sig.kv_usage < 1 and sig.preemptions_total == 0
    labels = {name: lab for name, lab, _ in metric_lines(text)}
    assert labels["vllm:num_requests_running"] == {"model_name": 'model "x"', "engine": "all"}
    buckets = [v for n, lab, v in metric_lines(text) if n == "vllm:time_to_first_token_seconds_bucket"]
    assert buckets and buckets == sorted(buckets)                # cumulative, +Inf last


def test_a_malformed_line_costs_only_that_line():
    text = ("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 4\n"
            "this is { not prometheus\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n")
    sig = parse_metrics(text)
    assert (sig.waiting, sig.running, sig.kv_usage) == (4, 2, 0.5)
