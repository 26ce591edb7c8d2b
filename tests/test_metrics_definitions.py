"""vLLM and GuideLLM definitions of TPOT and ITL on a hand-computed example."""

from __future__ import annotations

import numpy as np
import pytest

from llmlb_bench.metrics.definitions import Definitions
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.store.views import Catalog
from metrics_helpers import seg, store_run


@pytest.fixture
def hand(tmp_path):
    """r1: sent 0, 5 tokens .1 .2 .3 .4 .5; r2: sent 1, tokens 1.3 1.8 2.3; r3 failed; r4: one token at 3.2."""
    store_run(tmp_path, "hand", {
        "request_id": [1, 2, 3, 4], "scheduled_s": [0.0, 1.0, 2.0, 3.0], "sent_s": [0.0, 1.0, 2.0, 3.0],
        "first_token_s": [0.1, 1.3, None, 3.2], "last_token_s": [0.5, 2.3, None, 3.2],
        "token_times": [[seg(0.1, 0.1, 5)], [seg(1.3, 0.0, 1), seg(1.8, 0.5, 2)], None, [seg(3.2, 0.0, 1)]],
        "output_tokens": [5, 3, 0, 1], "status": ["ok", "ok", "error", "ok"]})
    return tmp_path


def summary(path, defs, slo=None):
    [s] = summarize(Catalog([path]), Slo.parse(slo), Options(definitions=defs))
    return s


def test_guidellm_itl_is_the_per_request_mean_weighted_by_gaps(hand):
    s = summary(hand, Definitions.guidellm)
    # r1: 0.4 / 4 = 0.1 (weight 4); r2: 1.0 / 2 = 0.5 (weight 2); r4 has no gap
    assert s["itl"]["n"] == 6
    assert s["itl"]["mean"] == pytest.approx(1.4 / 6)
    assert s["itl"]["p50"] == pytest.approx(0.1) and s["itl"]["p90"] == pytest.approx(0.5)


def test_guidellm_tpot_includes_the_first_token_weighted_by_tokens(hand):
    s = summary(hand, Definitions.guidellm)
    # (last - sent) / n: r1 0.5/5 = 0.1 (w 5), r2 1.3/3 (w 3), r4 0.2/1 (w 1)
    assert s["tpot"]["n"] == 9
    assert s["tpot"]["mean"] == pytest.approx(2.0 / 9)
    assert s["tpot"]["p50"] == pytest.approx(0.1)       # cdf 5/9 >= 0.5 at the first value
    assert s["tpot"]["p90"] == pytest.approx(1.3 / 3)
    assert s["ttft"]["p50"] == pytest.approx(0.2)       # inverse CDF: no interpolation


def test_vllm_definitions_are_the_default(hand):
    s = summary(hand, Definitions.vllm)
    assert s["definitions"] == "vllm"
    assert s["itl"]["n"] == 6 and s["itl"]["p50"] == pytest.approx(np.percentile([0.1] * 4 + [0.5] * 2, 50))
    assert s["tpot"]["p50"] == pytest.approx(np.percentile([0.1, 0.5], 50))
    assert s["norm_latency"]["p50"] == pytest.approx(np.percentile([0.1, 1.3 / 3, 0.2], 50))


def test_slo_goodput_does_not_depend_on_the_definitions(hand):
    a = summary(hand, Definitions.vllm, "ttft=250ms,tpot=200ms")["slo"]
    b = summary(hand, Definitions.guidellm, "ttft=250ms,tpot=200ms")["slo"]
    assert a == b and a["good"] == 2
