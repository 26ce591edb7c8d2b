"""Attainment per SLO class and tenant, per-class SLOs, offered rate and maximum goodput over loads."""

from __future__ import annotations

import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.metrics.goodput import max_goodput, offered_rate
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.store.views import Catalog
from metrics_helpers import store_run


@pytest.fixture
def classes(tmp_path):
    """Four requests sent 1 s apart: TTFT .2 / .8 / 3 / (failed); E2E 1 / 2 / 10 / -."""
    store_run(tmp_path, "cls", {
        "request_id": [1, 2, 3, 4], "slo_class": ["chat", "chat", "batch", "batch"],
        "tenant": ["t1", "t2", "t1", None],
        "scheduled_s": [0.0, 1.0, 2.0, 3.0], "sent_s": [0.0, 1.0, 2.0, 3.0],
        "first_token_s": [0.2, 1.8, 5.0, None], "last_token_s": [1.0, 3.0, 12.0, None],
        "output_tokens": [10, 20, 30, 0], "status": ["ok", "ok", "ok", "error"]})
    return tmp_path


def test_one_slo_for_every_class(classes):
    [s] = summarize(Catalog([classes]), Slo.parse("ttft=500ms"))
    assert s["slo"]["good"] == 1 and s["slo"]["attainment"] == 0.25
    assert s["per_class"]["chat"]["attainment"] == 0.5 and s["per_class"]["batch"]["attainment"] == 0.0
    assert s["per_tenant"]["t1"]["attainment"] == 0.5 and s["per_tenant"]["default"]["attainment"] == 0.0
    assert s["per_class"]["chat"]["ttft_p50"] == pytest.approx(0.5)   # (0.2 + 0.8) / 2


def test_per_class_slos(classes):
    slo = Slo.parse("ttft=500ms;batch:e2e=15s")
    [s] = summarize(Catalog([classes]), slo)
    # chat: ttft .2 ok, .8 missed; batch: e2e 10 ok, failed one not
    assert s["per_class"]["chat"]["good"] == 1 and s["per_class"]["batch"]["good"] == 1
    assert s["slo"]["good"] == 2 and s["slo"]["good_tokens"] == 40
    assert s["slo"]["goodput"] == pytest.approx(2 / 4.0)                    # arrival window 3 x 4 / 3 s
    assert s["over_duration"]["goodput"] == pytest.approx(2 / 12.0)        # to the last token at 12 s
    assert slo.limits_for("batch") == {"e2e": 15.0} and slo.limits_for("chat") == {"ttft": 0.5}
    assert slo.describe() == "ttft=500ms;batch:e2e=15000ms"
    assert slo.to_dict() == {"ttft_s": 0.5, "classes": {"batch": {"e2e_s": 15.0}}}


@pytest.mark.parametrize("text, fragment", [
    ("ttft=1s;tpot=1ms", "more than one spec without a class prefix"), ("batch:foo=1", "unknown SLO metric"),
])
def test_bad_class_slos(text, fragment):
    with pytest.raises(UserError, match=fragment):
        Slo.parse(text)


def test_offered_rate_declared_or_derived():
    assert offered_rate({"config": {"offered_rate": 7.5}}, 10, 0.0, 1.0) == 7.5
    assert offered_rate({"config": {"sweep": {"rate": 3.0}}}, 10, 0.0, 1.0) == 3.0
    assert offered_rate({}, 11, 2.0, 4.0) == 5.0            # 10 gaps in 2 s
    assert offered_rate({}, 1, 0.0, 0.0) is None


def test_max_goodput_is_the_highest_rate_meeting_the_target(tmp_path):
    """Runs at 1, 2, 4 and 8 req/s; attainment 1.0, 0.95, 0.5, 0.92 -> the highest passing rate is 8
    (the definition takes rates as run, DistServe style); with a 0.96 target it is 1."""
    runs = []
    for rate, good in ((1, 20), (2, 19), (4, 10), (8, 23)):
        n = 20 if rate != 8 else 25
        ttft = [0.1] * good + [5.0] * (n - good)
        sent = [i / rate for i in range(n)]
        store_run(tmp_path, f"r{rate}", {
            "request_id": list(range(n)), "sent_s": sent, "scheduled_s": sent,
            "first_token_s": [s + t for s, t in zip(sent, ttft)], "last_token_s": [s + t for s, t in zip(sent, ttft)],
            "output_tokens": [1] * n, "status": ["ok"] * n},
            config={"offered_rate": float(rate)})
        runs.append(rate)
    summaries = summarize(Catalog([tmp_path]), Slo.parse("ttft=1s"))
    best = max_goodput(summaries, 0.9)
    assert best["rate"] == 8.0 and best["attainment"] == pytest.approx(23 / 25) and best["run_id"] == "r8"
    assert max_goodput(summaries, 0.96)["rate"] == 1.0
    assert max_goodput(summaries, 1.01) is None


def test_the_drain_tail_does_not_deflate_goodput(tmp_path):
    """100 requests at 1 req/s, each 30 s long: over the arrival window goodput is the offered rate;
    over the whole duration (vLLM bench serve's) the 30 s tail after the last arrival deflates it by a quarter."""
    n = 100
    sched = [float(i) for i in range(n)]
    store_run(tmp_path, "tail", {"request_id": list(range(n)), "scheduled_s": sched, "sent_s": sched,
                                 "first_token_s": [t + 0.1 for t in sched], "last_token_s": [t + 30.0 for t in sched],
                                 "output_tokens": [100] * n, "status": ["ok"] * n})
    [s] = summarize(Catalog([tmp_path]), Slo.parse("ttft=500ms"))
    assert s["offered_rate"] == pytest.approx(1.0)
    assert s["slo"]["goodput"] == pytest.approx(1.0) and s["request_throughput"] == pytest.approx(1.0)
    assert s["over_duration"]["goodput"] == pytest.approx(100 / 129.0)
