"""llmlb validate against a real vLLM CPU replica (tiny random-weight model): it calibrates the
replica, replays a small default trace twice, simulates it under two seeds and prints the
bias/spread table and the verdict. vLLM comes from scripts/install_vllm_cpu.sh; without it the
test fails where ``CI`` is set and skips elsewhere (tests/engines_helpers.py).

The machine is shared and loaded, so the aims themselves are not asserted (docs/fidelity.md
reports what a run reaches, with its load average); what must hold: every figure compared, both
sides stored as runs, and a bias far below what a broken model gives (a profile in the wrong
units, a lost request overhead, a run compared against another trace are off by 2x or more)."""

from __future__ import annotations

import json
import math

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
    assert len(summary["real_runs"]) == len(summary["sim_runs"]) == 2
    assert set(summary["figures"]) >= {"ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90"}
    for name, fig in summary["figures"].items():
        assert all(math.isfinite(v) and v > 0 for v in fig["real_s"] + fig["sim_s"]), name
    assert abs(summary["figures"]["e2e_p50"]["bias"]) < 0.5, summary["figures"]["e2e_p50"]
    assert summary["e2e_mape_median"] is not None
