"""Latency and throughput against offered load, with the knee of a synthetic hockey stick."""

from __future__ import annotations

import pytest

from llmlb_bench.metrics.load import load_curves
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.store.views import Catalog
from metrics_helpers import store_run

#: mean E2E by offered rate: flat to 3 req/s, then a straight climb -> the knee is at 3
HOCKEY = {1.0: 1.0, 2.0: 1.0, 3.0: 1.0, 4.0: 3.0, 5.0: 5.0}


@pytest.fixture
def sweep(tmp_path):
    for policy in ("rr", "lo"):
        for rate, e2e in HOCKEY.items():
            n = 10
            sent = [i / rate for i in range(n)]
            store_run(tmp_path, f"{policy}-{rate:g}", {
                "request_id": list(range(n)), "sent_s": sent, "scheduled_s": sent,
                "first_token_s": [s + 0.1 for s in sent], "last_token_s": [s + e2e for s in sent],
                "output_tokens": [10] * n, "status": ["ok"] * n},
                config={"offered_rate": rate, "policy": {"name": policy}}, backend="sim")
    return tmp_path


def test_curves_group_runs_by_configuration_and_find_the_knee(sweep):
    cat = Catalog([sweep])
    summaries = summarize(cat, Slo.parse("e2e=2s"))
    curves = load_curves(summaries, target=0.9)
    assert sorted(c["name"] for c in curves) == ["lo", "rr"]
    for c in curves:
        assert [p["rate"] for p in c["points"]] == sorted(HOCKEY)
        assert [p["e2e"]["mean"] for p in c["points"]] == pytest.approx(list(HOCKEY.values()))
        assert c["knee_rate"] == 3.0 and c["knee_figure"] == "e2e.mean"
        assert c["max_goodput"]["rate"] == 3.0      # E2E 3 s breaks the 2 s SLO from 4 req/s on
        # throughput tracks the offered rate: n requests over (n - 1) / rate + e2e seconds
        p = c["points"][0]
        assert p["throughput"] == pytest.approx(10 / (9 + 1.0)) and "ci" in p["e2e"]


def test_a_single_rate_makes_no_curve(tmp_path):
    store_run(tmp_path, "one", {"request_id": [0, 1], "sent_s": [0.0, 1.0], "scheduled_s": [0.0, 1.0],
                                "first_token_s": [0.1, 1.1], "last_token_s": [0.2, 1.2], "output_tokens": [2, 2],
                                "status": ["ok", "ok"]})
    cat = Catalog([tmp_path])
    assert load_curves(summarize(cat)) == []


def test_curves_join_only_runs_that_differ_in_load_alone(tmp_path):
    """Two unrelated replays at different rates (other endpoints, other traces) make no curve;
    runs are named by what sets them apart."""
    for run_id, backend, rate, eps in (("a", "replay", 5.0, ["http://127.0.0.1:1"]),
                                       ("b", "replay", 9.0, ["http://127.0.0.1:2", "http://127.0.0.1:3"]),
                                       ("c", "sim", 5.0, None)):
        store_run(tmp_path, run_id, {"request_id": [0, 1], "sent_s": [0.0, 1.0], "scheduled_s": [0.0, 1.0],
                                     "first_token_s": [0.1, 1.1], "last_token_s": [0.2, 1.2],
                                     "output_tokens": [2, 2], "status": ["ok", "ok"]}, backend=backend,
                  label="least_outstanding",
                  config={"offered_rate": rate, "policy": {"name": "least_outstanding"},
                          **({"endpoints": eps} if eps else {})})
    summaries = summarize(Catalog([tmp_path]))
    assert load_curves(summaries) == []
    names = {s["run_id"]: s["name"] for s in summaries}
    assert names == {"a": "backend replay · cluster 1 endpoint · rate 5 req/s",
                     "b": "backend replay · cluster 2 endpoints · rate 9 req/s",
                     "c": "backend sim · cluster - · rate 5 req/s"}
