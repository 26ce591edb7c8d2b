"""Report figures against a hand-computed example."""

from __future__ import annotations

import numpy as np
import pytest

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.store import RunStore
from llmlb_bench.store.views import Catalog
from llmlb_bench.errors import UserError


def seg(start, gap, count):
    return {"start_s": start, "gap_s": gap, "count": count}


@pytest.fixture
def hand_run(tmp_path):
    """Four requests whose every figure is easy to compute by hand.

    r1: sent 0, tokens at .1 .2 .3 .4 .5      -> TTFT .1, TPOT .1, E2E .5, ITL 4 x .1
    r2: sent 1, tokens at 1.3, 1.8, 2.3       -> TTFT .3, TPOT .5, E2E 1.3, ITL .5 .5
    r3: sent 2, HTTP 500                      -> failed
    r4: sent 3, one token at 3.2              -> TTFT .2, TPOT undefined, E2E .2
    """
    with RunStore(tmp_path, config={"policy": {"name": "hand"}}, backend="test", label="hand", run_id="hand") as run:
        run.requests.write({
            "request_id": [1, 2, 3, 4],
            "scheduled_s": [0.0, 1.0, 2.0, 3.0],
            "sent_s": [0.0, 1.0, 2.0, 3.0],
            "first_token_s": [0.1, 1.3, None, 3.2],
            "last_token_s": [0.5, 2.3, None, 3.2],
            "token_times": [[seg(0.1, 0.1, 5)], [seg(1.3, 0.0, 1), seg(1.8, 0.5, 2)], None, [seg(3.2, 0.0, 1)]],
            "input_tokens": [10, 20, 30, 40],
            "output_tokens": [5, 3, 0, 1],
            "status": ["ok", "ok", "error", "ok"],
            "http_status": [200, 200, 500, 200],
        })
    return tmp_path


def test_counts_throughput_and_latency_percentiles(hand_run):
    [s] = summarize(Catalog([hand_run]))
    assert (s["requests"], s["ok"], s["error"]) == (4, 3, 1)
    assert s["duration_s"] == pytest.approx(3.2)  # first scheduled 0 -> last token 3.2
    # arrivals every second: window (3 - 0) x 4 / 3 = 4 s, over which 4 requests arrive at the offered 1 req/s
    assert s["window_s"] == pytest.approx(4.0) and s["offered_rate"] == pytest.approx(1.0)
    assert s["request_throughput"] == pytest.approx(3 / 4.0)
    assert s["output_throughput"] == pytest.approx(9 / 4.0)
    # vLLM bench serve's, over the whole duration
    assert s["over_duration"]["request_throughput"] == pytest.approx(3 / 3.2)
    assert s["over_duration"]["output_throughput"] == pytest.approx(9 / 3.2)
    ttft = [0.1, 0.3, 0.2]
    for p in (50, 90, 99):
        assert s["ttft"][f"p{p}"] == pytest.approx(np.percentile(ttft, p))
        assert s["tpot"][f"p{p}"] == pytest.approx(np.percentile([0.1, 0.5], p))
        assert s["e2e"][f"p{p}"] == pytest.approx(np.percentile([0.5, 1.3, 0.2], p))
        assert s["itl"][f"p{p}"] == pytest.approx(np.percentile([0.1] * 4 + [0.5, 0.5], p))
    assert s["ttft"]["mean"] == pytest.approx(0.2)
    assert s["itl"]["mean"] == pytest.approx((0.4 + 1.0) / 6)


def test_slo_attainment_and_goodput(hand_run):
    slo = Slo.parse("ttft=250ms,tpot=200ms")
    [s] = summarize(Catalog([hand_run]), slo)
    # r1 meets both; r2 misses TTFT; r3 failed; r4 meets TTFT and has no TPOT (counts as met, as in vLLM)
    assert s["slo"]["good"] == 2
    assert s["slo"]["attainment"] == pytest.approx(0.5)
    assert s["slo"]["goodput"] == pytest.approx(2 / 4.0)
    assert s["slo"]["good_token_throughput"] == pytest.approx(6 / 4.0)
    assert s["over_duration"]["goodput"] == pytest.approx(2 / 3.2)
    assert s["over_duration"]["good_token_throughput"] == pytest.approx(6 / 3.2)


def test_itl_percentiles_match_numpy_on_random_segments(tmp_path):
    rng = np.random.default_rng(3)
    rows, expanded = [], []
    for _ in range(40):
        t, segs, deliveries = 0.0, [], []
        for _ in range(rng.integers(1, 5)):
            t += rng.uniform(0.01, 0.3)
            gap, cnt = float(rng.choice([0.0, rng.uniform(0.005, 0.05)])), int(rng.integers(1, 30))
            segs.append(seg(t, gap, cnt))
            # a segment of gap 0 is one delivery of its tokens (ITL counts gaps between deliveries)
            deliveries += [t + gap * k for k in range(cnt)] if gap > 0 else [t]
            t = deliveries[-1]
        expanded += list(np.diff(deliveries))
        rows.append(segs)
    with RunStore(tmp_path, config={}, backend="test", run_id="rnd") as run:
        run.requests.write({"request_id": list(range(40)), "status": ["ok"] * 40, "token_times": rows,
                            "sent_s": [0.0] * 40, "scheduled_s": [0.0] * 40})
    [s] = summarize(Catalog([tmp_path]))
    for p in (50, 90, 99):
        assert s["itl"][f"p{p}"] == pytest.approx(np.percentile(expanded, p), abs=1e-12)


@pytest.mark.parametrize("text, fragment", [
    ("ttft=abc", "cannot parse"), ("foo=1ms", "unknown SLO metric 'foo'"), ("ttft=0", "must be positive"),
])
def test_bad_slo_strings(text, fragment):
    with pytest.raises(UserError, match=fragment):
        Slo.parse(text)


def test_slo_units():
    assert Slo.parse("ttft=1.5s,tpot=50,e2e=200000us").to_dict() == pytest.approx({"ttft_s": 1.5, "tpot_s": 0.05, "e2e_s": 0.2})
