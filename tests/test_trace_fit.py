"""``trace fit``: recover known parameters, reproduce real traces, write specs that load."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmlb_bench.cli import main
from llmlb_bench.errors import UserError
from llmlb_bench.schema import write_trace
from llmlb_bench.workload import WorkloadSpec, generate, load_spec
from llmlb_bench.workload.fit import compare, fit_lengths, fit_trace
from llmlb_bench.workload.importers import import_trace


def test_lognormal_is_recovered():
    x = np.rint(np.random.default_rng(0).lognormal(np.log(600), 0.9, 50_000))
    f = fit_lengths(x)
    assert f.lengths.dist.name == "lognormal" and f.ks < 0.02
    assert abs(math.exp(f.lengths.dist.mu) - 600) / 600 < 0.02 and abs(f.lengths.dist.sigma - 0.9) < 0.02


def test_bimodal_outputs_pick_the_mixture():
    rng = np.random.default_rng(1)
    x = np.rint(np.concatenate([rng.lognormal(np.log(200), 0.4, 30_000), rng.lognormal(np.log(5000), 0.3, 70_000)]))
    f = fit_lengths(x)
    assert f.lengths.dist.name == "mixture" and f.ks < 0.02
    assert np.allclose(sorted(f.lengths.dist.weights), [0.3, 0.7], atol=0.01)


def test_odd_shapes_fall_back_to_empirical_quantiles():
    x = np.concatenate([np.full(5000, 7), np.arange(1, 3000)])
    f = fit_lengths(x)
    assert f.lengths.dist.name == "empirical" and f.ks < 0.02


def test_fit_recovers_windows_and_tenants():
    spec = WorkloadSpec.from_dict({"seed": 2, "duration_s": 3000.0, "tenants": {
        "a": {"arrival": {"process": "gamma", "rate": 8.0, "cv": 2.0,
                          "modulation": {"shape": "piecewise", "at_s": [0, 1500], "factor": [1.0, 0.25]}},
              "input": {"dist": "lognormal", "median": 300, "sigma": 0.7},
              "output": {"dist": "lognormal", "median": 90, "sigma": 0.5}, "io_correlation": 0.6,
              "kind": "code", "priority": 2},
        "b": {"arrival": {"process": "poisson", "rate": 2.0}, "input": {"dist": "exponential", "mean": 100},
              "output": {"dist": "fixed", "value": 30}}}})
    table = generate(spec)
    result = fit_trace(table, window_s=500.0)
    a = result.spec["tenants"]["a"]
    assert np.allclose(a["arrival"]["rate"], [8, 8, 8, 2, 2, 2], rtol=0.12)
    assert all(1.6 < cv < 2.4 for cv in a["arrival"]["cv"][:3])
    assert abs(a["io_correlation"] - 0.6) < 0.05
    assert (a["kind"], a["priority"]) == ("code", 2)
    assert result.spec["tenants"]["b"]["output"]["dist"] in ("fixed", "empirical", "exponential", "lognormal")
    regenerated = generate(WorkloadSpec.from_dict(result.spec))
    c = compare(table, regenerated)
    assert c["input_ks"] < 0.03 and abs(c["rate_ratio"] - 1) < 0.05


def test_too_small_trace():
    spec = WorkloadSpec.from_dict({"requests": 5, "tenants": {"a": {
        "arrival": {"process": "poisson", "rate": 1.0}, "input": {"dist": "fixed", "value": 1},
        "output": {"dist": "fixed", "value": 1}}}})
    with pytest.raises(UserError, match="too few requests"):
        fit_trace(generate(spec))


def test_real_azure_conversation_fit(shared_data):
    table = import_trace("azure-2023", shared_data / "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv").table
    result = fit_trace(table)
    c = compare(table, generate(WorkloadSpec.from_dict(result.spec)))
    assert c["input_ks"] < 0.05 and c["output_ks"] < 0.05
    assert abs(c["rate_ratio"] - 1) < 0.05


def test_cli_fit_writes_a_spec_that_generates(tmp_path, capsys):
    spec = WorkloadSpec.from_dict({"seed": 4, "duration_s": 1200.0, "tenants": {"chat": {
        "arrival": {"process": "poisson", "rate": 5.0}, "input": {"dist": "lognormal", "median": 300, "sigma": 1.0},
        "output": {"dist": "lognormal", "median": 100, "sigma": 0.6}}}})
    trace = tmp_path / "t.parquet"
    write_trace(generate(spec), trace)
    out = tmp_path / "fit.toml"
    main(["trace", "fit", str(trace), "-o", str(out)])
    text = capsys.readouterr().out
    assert "generated look-alike" in text and "KS" in text
    fitted = load_spec(out)
    assert fitted.tenants[0].input.dist.name == "lognormal"
    assert out.read_text().startswith("# Fitted by `llmlb trace fit`")
    main(["gen", str(out), "-o", str(tmp_path / "again.parquet"), "--rate-scale", "2"])
    assert "requests" in capsys.readouterr().out
