"""Per-adapter figures of the report and their documented SQL (docs/metrics.md, "LoRA adapters")."""

from __future__ import annotations

import numpy as np
import pytest
from metrics_helpers import store_run

from llmlb_bench.metrics.slo import Slo
from llmlb_bench.metrics.summary import summarize
from llmlb_bench.store.views import Catalog
from tests.test_metrics_docs import find


def test_per_adapter_figures_match_the_documented_sql(tmp_path):
    rng = np.random.default_rng(4)
    n = 120
    sched = np.sort(rng.uniform(0, 20, n))
    ttft = rng.exponential(0.3, n)
    adapters = rng.choice(["a", "b", "base-model"], n).tolist()
    adapters = [None if a == "base-model" else a for a in adapters]
    store_run(tmp_path, "lora", {
        "request_id": list(range(n)), "scheduled_s": sched, "sent_s": sched, "first_token_s": sched + ttft,
        "last_token_s": sched + ttft + 1.0, "output_tokens": [20] * n, "status": ["ok"] * n, "adapter": adapters},
        series={"t_s": [0.0, 1.0, 0.0, 1.0], "target": ["r0", "r0", "r1", "r1"], "adapter_loads": [2, 1, 0, 4]},
        backend="sim")
    [s] = summarize(Catalog([tmp_path]), Slo.parse("ttft=300ms"))
    per = s["per_adapter"]
    assert set(per) == {"a", "b", "base"}
    rows = {r["adapter"]: r for r in Catalog([tmp_path], confined=True).query_read_only(
        find("adapter_p99_ttft")).to_pylist()}
    for name, d in per.items():
        assert d["requests"] == rows[name]["requests"]
        assert d["ttft_p99"] == pytest.approx(rows[name]["adapter_p99_ttft"])
        assert d["e2e_p99"] == pytest.approx(rows[name]["adapter_p99_e2e"])
        mask = np.array([(a or "base") == name for a in adapters])
        assert d["attainment"] == pytest.approx(np.mean(ttft[mask] <= 0.3))
    assert s["adapter_loads"] == {"total": 7, "per_target": {"r0": 3, "r1": 4}}
    loads = Catalog([tmp_path], confined=True).query_read_only(find("sum(adapter_loads)")).to_pylist()
    assert {r["target"]: r["loads"] for r in loads} == s["adapter_loads"]["per_target"]


def test_runs_without_the_adapter_column_still_report(tmp_path):
    import pyarrow.parquet as pq
    store_run(tmp_path, "old", {"request_id": [0, 1], "scheduled_s": [0.0, 1.0], "sent_s": [0.0, 1.0],
                                "first_token_s": [0.1, 1.1], "last_token_s": [0.5, 1.5], "output_tokens": [3, 3],
                                "status": ["ok", "ok"]})
    # written before the column existed: drop it from the file
    [part] = list((tmp_path).rglob("requests.parquet/*.parquet")) or list(tmp_path.rglob("requests.parquet"))
    table = pq.read_table(part)
    pq.write_table(table.drop_columns(["adapter"]), part)
    [s] = summarize(Catalog([tmp_path]), None)
    assert s["ok"] == 2 and s["per_adapter"] is None
