"""Energy per token and cost per good token on a hand-computed example."""

from __future__ import annotations

import pytest

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import Options, summarize
from llmlb_bench.store.views import Catalog
from metrics_helpers import store_run

CLUSTER = {"cluster": {"pools": [{"name": "default", "replicas": 2, "tp": 2, "gpu": "a100-80g"}], "catalogs": []}}


@pytest.fixture
def powered(tmp_path):
    """Two requests (60 and 40 output tokens) over 4 s; r0 draws 100, 200, 150 W over [0,1], [1,2], [2,4];
    r1 80 W over [0, 2]. Energy: r0 100 + 200 + 300 = 600 J (150 W average), r1 160 J (80 W)."""
    store_run(tmp_path, "pw", {
        "request_id": [1, 2], "sent_s": [0.0, 1.0], "scheduled_s": [0.0, 1.0], "first_token_s": [0.2, 3.0],
        "last_token_s": [2.0, 4.0], "output_tokens": [60, 40], "energy_j": [300.0, 200.0], "status": ["ok", "ok"]},
        series={"t_s": [0.0, 1.0, 2.0, 4.0, 0.0, 2.0], "target": ["r0"] * 4 + ["r1"] * 2,
                "power_w": [50.0, 100.0, 200.0, 150.0, 60.0, 80.0]},
        config=CLUSTER)
    return tmp_path


def test_energy_per_token_and_per_good_token(powered):
    # request 2 misses a 1 s TTFT: good tokens = 60
    [s] = summarize(Catalog([powered]), Slo.parse("ttft=1s"))
    e = s["energy"]
    assert e["energy_source"] == "series" and e["energy_j"] == pytest.approx(760.0)
    assert e["avg_power_w"] == pytest.approx({"r0": 150.0, "r1": 80.0})
    assert e["avg_power_per_replica_w"] == pytest.approx(115.0)
    assert e["j_per_output_token"] == pytest.approx(7.6)
    assert e["j_per_good_token"] == pytest.approx(760 / 60)
    assert e["attributed_energy_j"] == 500.0


def test_cost_from_the_gpu_catalog_and_from_a_given_price(powered):
    [s] = summarize(Catalog([powered]), Slo.parse("ttft=1s"))
    e = s["energy"]
    # 2 replicas x TP 2 = 4 A100s at 5.12 $/h (llmlb_bench/catalog/gpus.toml) for 4 s
    assert e["gpus"] == 4 and e["price_source"] == "catalog"
    assert e["cost_usd"] == pytest.approx(4 * 5.12 * 4 / 3600)
    assert e["usd_per_m_good_tokens"] == pytest.approx(e["cost_usd"] / 60 * 1e6)
    [g] = summarize(Catalog([powered]), Slo.parse("ttft=1s"), Options(price_per_hour=36.0))
    assert g["energy"]["price_source"] == "given" and g["energy"]["cost_usd"] == pytest.approx(0.04)
    assert g["energy"]["usd_per_m_good_tokens"] == pytest.approx(0.04 / 60 * 1e6)
    assert g["energy"]["usd_per_m_output_tokens"] == pytest.approx(0.04 / 100 * 1e6)


def test_without_power_samples_the_attributed_energy_is_used(tmp_path):
    store_run(tmp_path, "np", {"request_id": [1], "sent_s": [0.0], "scheduled_s": [0.0], "first_token_s": [0.1],
                               "last_token_s": [1.0], "output_tokens": [10], "energy_j": [25.0], "status": ["ok"]})
    [s] = summarize(Catalog([tmp_path]))
    e = s["energy"]
    assert e["energy_source"] == "requests" and e["j_per_output_token"] == 2.5
    assert e["avg_power_w"] is None and e["cost_usd"] is None and e["gpus"] is None
