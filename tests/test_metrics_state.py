"""Prefix cache, KV pressure, queues, preemptions and the client self-check, by hand."""

from __future__ import annotations

import pytest

from llmlb_bench.metrics.summary import summarize
from llmlb_bench.store.views import Catalog
from metrics_helpers import store_run


def test_serving_state(tmp_path):
    client = {"dispatch_lag_ms": {"p50": 0.1, "p99": 0.9, "max": 2.0}, "flagged": False, "cpu_ms_per_request": 0.3}
    store_run(tmp_path, "st", {
        "request_id": [1, 2, 3], "sent_s": [0.0, 0.5, 1.0], "scheduled_s": [0.0, 0.5, 1.0],
        "first_token_s": [0.1, 0.6, None], "last_token_s": [0.2, 0.9, None], "output_tokens": [2, 4, 0],
        "input_tokens": [100, 300, 50], "cached_tokens": [50, 150, 0], "preemptions": [0, 2, 1],
        "status": ["ok", "ok", "error"]},
        series={"t_s": [0.0, 1.0, 2.0, 3.0], "target": ["a", "a", "b", "b"],
                "waiting": [0, 4, 1, 3], "running": [2, 6, 1, 1],
                "kv_blocks_used": [10, 96, 50, 100], "kv_blocks_total": [100, 100, 100, 100]},
        summary={"client": client})
    [s] = summarize(Catalog([tmp_path]))
    st = s["state"]
    assert st["prefix_cache_hit_rate"] == pytest.approx(200 / 400)   # ok requests only
    assert st["preemptions"] == 3 and st["preempted_requests"] == 2
    # per replica: a kv mean .53, max .96, 1 of 2 samples >= .95; b .75, 1.0, 1 of 2
    assert st["per_target"]["a"]["kv_mean"] == pytest.approx(0.53)
    assert st["kv_util_mean"] == pytest.approx((0.53 + 0.75) / 2) and st["kv_util_max"] == 1.0
    assert st["kv_high_share"] == pytest.approx(0.5)
    assert st["waiting_mean"] == pytest.approx((2 + 2) / 2) and st["waiting_max"] == 4
    assert st["running_max"] == 6
    assert st["client"] == client
