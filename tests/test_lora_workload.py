"""LoRA adapters in traces: Zipf popularity in workload specs, the adapter column of imports."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.schema import read_trace, write_trace
from llmlb_bench.workload.generate import generate
from llmlb_bench.workload.importers import import_trace
from llmlb_bench.workload.spec import WorkloadSpec
from llmlb_bench.workload.stats import trace_stats


def _spec(adapters, sessions=False, requests=40_000):
    tenant = {"arrival": {"process": "poisson", "rate": 100}, "input": {"dist": "fixed", "value": 100},
              "output": {"dist": "fixed", "value": 10}, "adapters": adapters}
    if sessions:
        tenant["sessions"] = {"turns": {"dist": "fixed", "value": 4}, "think_s": {"dist": "fixed", "value": 1}}
    return WorkloadSpec.from_dict({"seed": 5, "requests": requests, "tenants": {"chat": tenant}})


def test_adapter_popularity_is_the_zipf_law_of_its_rank():
    t = generate(_spec({"count": 6, "zipf_s": 1.2, "base_fraction": 0.2}))
    col = t.column("adapter").to_pylist()
    n = len(col)
    p = np.arange(1, 7, dtype=float) ** -1.2
    expected = 0.8 * p / p.sum()
    seen = np.array([col.count(f"lora-{k}") for k in range(6)]) / n
    # binomial standard errors at n = 40,000 are below 0.0025: 4 sigma
    assert np.abs(seen - expected).max() < 0.01
    assert abs(col.count(None) / n - 0.2) < 0.01


def test_a_conversation_keeps_one_adapter_and_the_draw_is_seeded():
    t = generate(_spec({"names": ["sql", "chat", "code"], "zipf_s": 0}, sessions=True, requests=2000))
    rows = t.select(["session_id", "adapter"]).to_pylist()
    by_session: dict[int, set] = {}
    for r in rows:
        by_session.setdefault(r["session_id"], set()).add(r["adapter"])
    assert all(len(v) == 1 for v in by_session.values())
    assert {a for v in by_session.values() for a in v} == {"sql", "chat", "code"}
    assert generate(_spec({"names": ["sql", "chat", "code"], "zipf_s": 0}, sessions=True, requests=2000)).equals(t)


def test_a_spec_without_adapters_writes_the_trace_it_always_wrote(tmp_path):
    spec = WorkloadSpec.from_dict({"seed": 1, "requests": 50, "tenants": {"a": {
        "arrival": {"process": "poisson", "rate": 5}, "input": {"dist": "fixed", "value": 10},
        "output": {"dist": "fixed", "value": 5}}}})
    write_trace(generate(spec), tmp_path / "t.parquet")
    import pyarrow.parquet as pq
    assert "adapter" not in pq.read_schema(tmp_path / "t.parquet").names     # left out when unused
    assert read_trace(tmp_path / "t.parquet").column("adapter").null_count == 50


@pytest.mark.parametrize("adapters, problem", [
    ({"count": 3, "names": ["a"]}, "give either names or count"),
    ({"names": ["a", "a"]}, "must be distinct"),
    ({"count": 0}, "tenants.chat.adapters.count: must be >= 1"),
    ({"count": 3, "zipf": 1.0}, "did you mean 'zipf_s'"),
    ({"count": 3, "base_fraction": 1.5}, "base_fraction: must be <= 1"),
])
def test_bad_adapter_tables_are_one_line_errors(adapters, problem):
    with pytest.raises(UserError) as err:
        _spec(adapters, requests=10)
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_importers_read_an_adapter_column_where_the_file_has_one(tmp_path):
    csv = tmp_path / "azure.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,lora_name\n"
                   "2023-11-16 18:15:46.6805900,374,44,sql-v2\n"
                   "2023-11-16 18:15:50.9951690,396,109,\n"
                   "2023-11-16 18:15:51.0000000,10,5,sql-v2\n")
    t = import_trace("azure-2023", csv).table
    assert t.column("adapter").to_pylist() == ["sql-v2", None, "sql-v2"]
    jl = tmp_path / "mooncake.jsonl"
    jl.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1], "adapter": 7}\n'
                  '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    assert import_trace("mooncake", jl).table.column("adapter").to_pylist() == ["7", None]
    plain = tmp_path / "plain.csv"
    plain.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n")
    assert pc.count(import_trace("azure-2023", plain).table.column("adapter")).as_py() == 0


def test_trace_stats_describe_the_adapters_against_the_zipf_law():
    t = generate(_spec({"count": 32, "zipf_s": 1.1, "base_fraction": 0.1}))
    a = trace_stats(t)["adapters"]
    p = np.arange(1, 33, dtype=float) ** -1.1
    p = 0.9 * p / p.sum()
    assert a["adapters"] == 32
    assert abs(a["base_share"] - 0.1) < 0.01
    assert abs(a["top1_share"] - p[0]) < 0.01 and abs(a["top10_share"] - p[:10].sum()) < 0.01
    assert "adapters" not in trace_stats(generate(_spec({"count": 1, "base_fraction": 1.0}, requests=50)))
