"""The cost model against measured layer timings (Vidur's A100/H100 profiles), before and after fitting its efficiency factors."""

from __future__ import annotations

import numpy as np
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.sim import load_catalog
from llmlb_bench.sim.cost_fit import (LAYER_OPS, error_table, find_vidur_profiles, fit_efficiency,
                                        read_vidur_mlp, relative_errors)

DATASHEET = (1.0, 1.0, 0.0)   # peak FLOP/s and bandwidth, no fixed latency: the uncalibrated roofline


@pytest.fixture
def vidur(shared_data):
    root = shared_data / "profiles" / "vidur"
    profiles = find_vidur_profiles(root)
    if not profiles:
        pytest.skip("no Vidur compute profiles under ../shared/data/profiles/vidur")
    return profiles


def test_calibration_cuts_the_error_and_the_catalog_holds_the_fit(vidur):
    cat = load_catalog()
    a100 = [p for p in vidur if p.gpu == "a100-80g"]
    fit = fit_efficiency(a100)
    g = cat.gpus["a100-80g"]
    assert fit.factors == (g.compute_efficiency, g.memory_efficiency, g.layer_latency_us)
    before = np.abs(relative_errors(a100, DATASHEET)).mean()
    after = np.abs(relative_errors(a100, fit.factors)).mean()
    assert before > 0.3 and after < 0.07
    for row in error_table(a100, {"fitted": fit.factors}):
        assert row["mean_pct"] < 7 and row["p90_pct"] < 15, row


def test_h100_fit_with_the_a100_memory_efficiency(vidur):
    h100 = [p for p in vidur if p.gpu == "h100-sxm"]
    if not h100:
        pytest.skip("no H100 profile")
    with pytest.raises(ValueError, match="fix one factor"):
        fit_efficiency(h100)
    g = load_catalog().gpus["h100-sxm"]
    fit = fit_efficiency(h100, {"memory_efficiency": load_catalog().gpus["a100-80g"].memory_efficiency})
    assert fit.factors == (g.compute_efficiency, g.memory_efficiency, g.layer_latency_us)
    assert np.abs(relative_errors(h100, fit.factors)).mean() < 0.10


def _write_profile(path, tokens, ms_per_op):
    cols = [f"time_stats.{op}.median" for op in LAYER_OPS] + ["num_tokens", "num_tensor_parallel_workers"]
    lines = [",".join(cols)] + [",".join([str(ms_per_op(t))] * len(LAYER_OPS) + [str(t), "1"]) for t in tokens]
    path.write_text("\n".join(lines) + "\n")


def test_fit_recovers_factors_of_a_synthetic_profile(tmp_path):
    """Profiles made by the model itself with known factors give those factors back."""
    from llmlb_bench.sim.cost_fit import predict_layer

    cat = load_catalog()
    g = cat.gpus["a100-80g"]
    profiles = []
    for name in ("llama-2-7b", "llama-3-70b"):
        m = cat.models[name]
        tokens = np.unique(np.geomspace(1, 16384, 60).astype(int))
        truth = predict_layer(m, g, tokens, np.ones_like(tokens), 0.7, 0.75, 30.0)
        path = tmp_path / f"{name}.csv"
        _write_profile(path, tokens.tolist(), lambda t, tr=dict(zip(tokens.tolist(), truth)): tr[t] * 1000 / len(LAYER_OPS))
        profiles.append(read_vidur_mlp(path, "a100-80g", name))
    fit = fit_efficiency(profiles)
    assert fit.factors == pytest.approx((0.7, 0.75, 30.0), abs=0.011)


def test_bad_profile_is_a_one_line_error(tmp_path):
    path = tmp_path / "mlp.csv"
    path.write_text("num_tokens,foo\n1,2\n")
    with pytest.raises(UserError, match="missing column") as e:
        read_vidur_mlp(path, "a100-80g", "llama-2-7b")
    assert e.value.where == str(path)
    with pytest.raises(UserError, match="cannot read profile"):
        read_vidur_mlp(tmp_path / "absent.csv", "a100-80g", "llama-2-7b")


def test_all_reduce_model_fits_the_measured_collectives(shared_data):
    from llmlb_bench.sim.cost_fit import find_vidur_all_reduce, fit_all_reduce, predict_all_reduce

    profiles = find_vidur_all_reduce(shared_data / "profiles" / "vidur")
    if not profiles:
        pytest.skip("no Vidur all_reduce profiles under ../shared/data/profiles/vidur/network")
    cat = load_catalog()
    for p in profiles:
        g = cat.gpus[p.gpu]
        assert fit_all_reduce(p) == (g.link_latency_us, g.link_gb_s)
        err = np.abs(predict_all_reduce(p, g.link_latency_us, g.link_gb_s) / p.seconds - 1)
        assert err.mean() < 0.12 and set(np.unique(p.gpus)) == {2, 4, 8}


def test_bad_all_reduce_profile_is_a_one_line_error(tmp_path):
    from llmlb_bench.sim.cost_fit import read_vidur_all_reduce

    path = tmp_path / "all_reduce.csv"
    path.write_text("size,num_workers\n1,2\n")
    with pytest.raises(UserError, match="missing column 'time_stats.all_reduce.median'"):
        read_vidur_all_reduce(path, "a100-80g")
