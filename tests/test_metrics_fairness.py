"""Fairness across tenants on a hand-computed two-tenant example (1-second windows)."""

from __future__ import annotations

import pytest

from llmlb_bench.metrics.fairness import jain
from llmlb_bench.metrics.run_figures import FairnessFigures
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.store.views import Catalog
from metrics_helpers import seg, store_run
from shape_check import mismatches


@pytest.fixture
def two_tenants(tmp_path):
    """A: a1 sent 0, first token 0.5 (10 in), tokens 0.5 .. 1.75 every 0.25 (6 out);
          a2 sent 1.1, one token at 1.6 (4 in).
       B: b1 sent 0.2, first token 1.2 (20 in), tokens 1.2 1.7 2.2 (3 out).

    Service (input x1 + output x2) per window, and who is backlogged (waiting for a first token):
      window 0 [0, 1): A 10 + 2x2 = 14, B 0;        backlogged A [0, .5), B [.2, 1)
      window 1 [1, 2): A 2x4 + 4 + 2x1 = 14, B 20 + 2x2 = 24;  backlogged A [1.1, 1.6), B [1, 1.2)
      window 2 [2, 3): B 2;                          backlogged: nobody
    """
    store_run(tmp_path, "fair", {
        "request_id": [1, 2, 3], "tenant": ["A", "A", "B"],
        "scheduled_s": [0.0, 1.1, 0.2], "sent_s": [0.0, 1.1, 0.2],
        "first_token_s": [0.5, 1.6, 1.2], "last_token_s": [1.75, 1.6, 2.2],
        "token_times": [[seg(0.5, 0.25, 6)], [seg(1.6, 0.0, 1)], [seg(1.2, 0.5, 3)]],
        "input_tokens": [10, 4, 20], "output_tokens": [6, 1, 3], "status": ["ok"] * 3})
    return tmp_path


def test_vtc_service_gap_and_windowed_jain(two_tenants):
    [s] = summarize(Catalog([two_tenants]), None, Options(window_s=1.0))
    f = s["fairness"]
    assert f["tenants"] == 2 and f["windows"] == 2
    assert f["service_gap_max"] == 14 and f["service_gap_mean"] == pytest.approx((14 + 10) / 2)
    # window 0: (14 + 0)^2 / (2 x 14^2) = 0.5; window 1: 38^2 / (2 x (14^2 + 24^2))
    assert f["jain_service"] == pytest.approx((0.5 + 38 ** 2 / (2 * (14 ** 2 + 24 ** 2))) / 2)
    assert f["per_tenant"]["A"]["service"] == 10 + 4 + 2 * 7 and f["per_tenant"]["B"]["service"] == 20 + 2 * 3


def test_slowdown_ratio_and_attainment_jain(two_tenants):
    [s] = summarize(Catalog([two_tenants]), Slo.parse("ttft=600ms"), Options(window_s=1.0))
    f = s["fairness"]
    # normalized latency: A (1.75/6 + 0.5/1) / 2, B 2.0/3
    assert f["slowdown_ratio"] == pytest.approx((2.0 / 3) / ((1.75 / 6 + 0.5) / 2))
    # TTFT: a1 .5 ok, a2 .5 ok, b1 1.0 missed -> attainment A 1, B 0 -> Jain 1 / 2
    assert s["per_tenant"]["A"]["attainment"] == 1.0 and s["per_tenant"]["B"]["attainment"] == 0.0
    assert f["jain_attainment"] == pytest.approx(0.5)
    assert mismatches(f, FairnessFigures, "fairness") == []   # the shape metrics/run_figures.py declares


def test_single_tenant_runs_have_no_fairness_section(tmp_path):
    store_run(tmp_path, "one", {"request_id": [1], "sent_s": [0.0], "scheduled_s": [0.0], "first_token_s": [0.1],
                                "last_token_s": [0.1], "output_tokens": [1], "status": ["ok"]})
    [s] = summarize(Catalog([tmp_path]))
    assert s["fairness"] is None


def test_jain_index():
    assert jain([1, 1, 1]) == 1.0
    assert jain([1, 0, 0, 0]) == 0.25       # one of four served: 1 / n
    assert jain([3, 1]) == pytest.approx(16 / 20)
    assert jain([]) is None and jain([0, 0]) is None
