"""Generation: determinism, Poisson arrivals and lognormal lengths checked against theory."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
from scipy import stats

from llmlb_bench.schema import TRACE, read_trace, trace_block_size, trace_spec, write_trace
from llmlb_bench.workload import WorkloadSpec, generate


def spec(requests=20_000, rate=50.0, **tenant):
    t = {"arrival": {"process": "poisson", "rate": rate},
         "input": {"dist": "lognormal", "median": 400, "sigma": 1.0},
         "output": {"dist": "lognormal", "median": 150, "sigma": 0.7, "max": 4096}}
    t.update(tenant)
    return WorkloadSpec.from_dict({"seed": 5, "requests": requests, "tenants": {"chat": t}})


def test_conforms_to_trace_schema():
    table = generate(spec(1000))
    assert table.schema.equals(TRACE.schema)
    assert table.num_rows == 1000
    assert table.column("request_id").to_pylist() == list(range(1000))
    arrival = table.column("arrival_s").to_numpy()
    assert np.all(np.diff(arrival) >= 0) and arrival[0] >= 0


def test_same_seed_gives_byte_identical_parquet(tmp_path):
    s = spec(5000)
    paths = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.parquet"
        write_trace(generate(s), path, spec=s.to_dict(), block_size=s.block_size)
        paths.append(path)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    other = generate(s, seed=6)
    assert not np.array_equal(other.column("input_tokens").to_numpy(), generate(s).column("input_tokens").to_numpy())


def test_metadata_carries_spec_and_block_size(tmp_path):
    s = spec(100)
    path = tmp_path / "t.parquet"
    write_trace(generate(s), path, spec=s.to_dict(), block_size=s.block_size)
    table = read_trace(path)
    assert trace_spec(table) == s.to_dict()
    assert trace_block_size(table) == 16
    assert pq.ParquetFile(path).metadata.num_rows == 100


def test_poisson_rate_and_cv():
    arrival = generate(spec(100_000, rate=50.0)).column("arrival_s").to_numpy()
    gaps = np.diff(arrival)
    assert abs(1 / gaps.mean() - 50.0) / 50.0 < 0.02
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05
    assert stats.kstest(gaps, "expon", args=(0, 1 / 50.0)).pvalue > 0.01


def test_lognormal_lengths_fit():
    table = generate(spec(100_000))
    inp = table.column("input_tokens").to_numpy().astype(float)
    # rounding to integers is invisible at a median of 400 except in the lowest few tokens
    assert stats.kstest(inp[inp > 20], "lognorm", args=(1.0, 0, 400)).statistic < 0.01
    mu, sigma = np.log(inp).mean(), np.log(inp).std()
    assert abs(np.exp(mu) - 400) / 400 < 0.02 and abs(sigma - 1.0) < 0.02
    out = table.column("output_tokens").to_numpy()
    assert out.max() <= 4096 and out.min() >= 1


def test_rate_scale_multiplies_rate_and_duration_mode():
    base = spec().replace(duration_s=200.0)
    n1 = generate(base).num_rows
    n2 = generate(base, rate_scale=2.0).num_rows
    assert abs(n1 - 10_000) < 5 * 100 and abs(n2 - 20_000) < 5 * 142
    assert generate(base).column("arrival_s").to_numpy().max() < 200.0


def test_tenants_superpose_and_keep_their_attributes():
    t = spec().to_dict()["tenants"]["chat"]
    s = WorkloadSpec.from_dict({"seed": 1, "duration_s": 100.0, "tenants": {
        "a": {**t, "arrival": {"process": "poisson", "rate": 10.0}, "slo_class": "tight", "priority": 2, "kind": "code"},
        "b": {**t, "arrival": {"process": "poisson", "rate": 30.0}},
    }})
    table = generate(s)
    tenant = np.array(table.column("tenant").to_pylist())
    assert abs((tenant == "a").mean() - 0.25) < 0.03
    rows = table.to_pylist()
    a = next(r for r in rows if r["tenant"] == "a")
    assert (a["slo_class"], a["priority"], a["kind"]) == ("tight", 2, "code")
    # Adding a tenant leaves the other's requests untouched (streams keyed by tenant name).
    only_a = WorkloadSpec.from_dict({"seed": 1, "duration_s": 100.0, "tenants": {"a": s.to_dict()["tenants"]["a"]}})
    assert np.array_equal(generate(only_a).column("arrival_s").to_numpy(),
                          table.column("arrival_s").to_numpy()[tenant == "a"])


def test_time_scale_stretches_every_time_and_label_names_the_tenant():
    t = {"arrival": {"process": "poisson", "rate": 5.0}, "input": {"dist": "fixed", "value": 10},
         "output": {"dist": "fixed", "value": 5},
         "sessions": {"turns": {"dist": "fixed", "value": 2}, "think_s": {"dist": "fixed", "value": 3.0}}}
    base = {"seed": 1, "requests": 400, "tenants": {"a": {**t, "label": "client-1"}, "b": {**t, "label": "client-1"}}}
    one = generate(WorkloadSpec.from_dict(base))
    two = generate(WorkloadSpec.from_dict({**base, "time_scale": 2.0}))
    assert np.allclose(two.column("arrival_s").to_numpy(), 2 * one.column("arrival_s").to_numpy())
    assert set(two.column("after_parent_s").drop_null().to_pylist()) == {6.0}
    assert set(one.column("tenant").to_pylist()) == {"client-1"}
    # two spec tenants with one label keep separate sessions (global session ids)
    sessions = one.column("session_id").to_numpy()
    assert np.bincount(sessions).max() == 2
