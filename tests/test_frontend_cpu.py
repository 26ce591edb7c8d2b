"""A profile's ``frontend_cpu_s``: the API server's CPU time per request taken from the engine's
steps (vLLM CPU runs its frontend on the engine's core; sim/profile.py, docs/fidelity.md).

Checked against what the model says exactly, on a profile whose decode step does not depend on
the context (so every decode step takes the same time): a request dispatched while another decodes
lengthens the step that follows by exactly ``frontend_cpu_s`` (here the step admitting it); a lone
request, dispatched to an idle engine, costs no step and keeps its time to first token (which is
why calibrate's prefill probes cannot see the term and the interference probe is needed); 0 or
absent changes no output; and the interference probe's observation, made from exactly simulated
rows, fits the term back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmlb_bench.calibrate.fit import UNKNOWNS, interference_observation, prefill_features
from llmlb_bench.calibrate.probes import INTERFERENCE_CONTEXT, ProbeRun
from llmlb_bench.errors import UserError
from llmlb_bench.schema import trace_table
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.profile import EngineProfile
from tests.sim_helpers import by_request_id, run_sim

#: a decode step of base + token + sample: 4.6 ms at any context (no attention or KV term)
STEP = {"base_s": 0.004, "per_token_s": 1e-4, "per_sample_s": 5e-4, "per_attn_s": 0.0, "per_kv_s": 0.0}
DECODE_S = 0.0046
ENGINE = {"max_num_seqs": 16, "max_num_batched_tokens": 1024, "block_size": 32, "num_kv_blocks": 2000,
          "max_model_len": 4096, "enable_prefix_caching": True}
OVERHEAD_S = 0.020


def profile(frontend: float | None = None, overhead: float = OVERHEAD_S, **extra: object) -> dict:
    p = {"llmlb_profile": 2, "engine": dict(ENGINE), "step": dict(STEP), "request_overhead_s": overhead, **extra}
    if frontend is not None:
        p["frontend_cpu_s"] = frontend
    return p


def _rows(tmp_path: Path, name: str, table, prof: dict, seed: int = 0) -> list[dict]:
    requests, _, _ = run_sim(tmp_path / name, table, ClusterConfig.build(replicas=1).with_profile(prof), seed=seed)
    return by_request_id(requests).to_pylist()


def test_an_arrival_takes_its_frontend_time_from_the_batch(tmp_path: Path):
    """A decodes 200 tokens; B (1 output token) is dispatched at 0.1 s, while A decodes. B still enters
    the queue after the whole overhead; the next step the replica plans, the one admitting B, lasts
    frontend_cpu_s longer: B's first token and A's last come exactly that much later. A, dispatched
    to an idle engine, is not charged."""
    f = 2 * DECODE_S
    trace = trace_table([0.0, 0.1003], [100, 100], [200, 1])
    delay = _rows(tmp_path, "delay", trace, profile())
    shared = _rows(tmp_path, "shared", trace, profile(f))
    (a0, b0), (a1, b1) = delay, shared
    assert a1["first_token_s"] == pytest.approx(a0["first_token_s"], abs=1e-12)     # lone: unchanged
    assert b1["first_token_s"] - b0["first_token_s"] == pytest.approx(f, abs=1e-9)
    assert a1["last_token_s"] - a0["last_token_s"] == pytest.approx(f, abs=1e-9)
    # four arrivals: four times the frontend time
    many = trace_table([0.0, 0.1003, 0.2003, 0.3003, 0.4003], 100, [200, 1, 1, 1, 1])
    d, s = _rows(tmp_path, "d4", many, profile()), _rows(tmp_path, "s4", many, profile(f))
    assert s[0]["last_token_s"] - d[0]["last_token_s"] == pytest.approx(4 * f, abs=1e-9)


def test_a_lone_request_keeps_its_time_to_first_token(tmp_path: Path):
    """Engine idle: the frontend's work and the prefill run one after the other either way, so time to
    first token is the overhead plus the prefill steps, what calibrate's prefill probes fit."""
    trace = trace_table([0.0], 1500, 2)
    (r,) = _rows(tmp_path, "lone", trace, profile(0.008))
    p = EngineProfile.from_dict(profile(0.008))
    theta = np.array([*(STEP[k] for k in ("base_s", "per_token_s", "per_sample_s", "per_attn_s", "per_kv_s")),
                      OVERHEAD_S, 0.0, p.frontend_cpu_s])
    features = prefill_features(1500, 0, ENGINE["max_num_batched_tokens"])
    assert features[UNKNOWNS.index("frontend_cpu_s")] == 0
    assert r["first_token_s"] - r["sent_s"] == pytest.approx(float(features @ theta), rel=1e-9)


def test_zero_or_absent_changes_nothing(tmp_path: Path):
    """frontend_cpu_s = 0 (or a profile without it, as every profile before it) gives identical rows,
    with jitter drawn too."""
    jitter = {"sigma": 0.2, "slow_rate_hz": 2.0, "slow_mean_s": 0.01, "slow_factor": 3.0}
    rng = np.random.default_rng(3)
    n = 120
    trace = trace_table(np.cumsum(rng.exponential(0.02, n)), rng.integers(20, 600, n), rng.integers(2, 80, n))
    old = _rows(tmp_path, "old", trace, profile(jitter=jitter), seed=4)
    zero = _rows(tmp_path, "zero", trace, profile(0.0, jitter=jitter), seed=4)
    assert old == zero
    assert _rows(tmp_path, "on", trace, profile(0.005, jitter=jitter), seed=4) != old


@pytest.mark.parametrize("bad", [-0.001, "x", True, float("nan")])
def test_a_bad_frontend_figure_is_a_one_line_error(bad: object):
    with pytest.raises(UserError, match="frontend_cpu_s"):
        EngineProfile.from_dict(profile(bad))  # type: ignore[arg-type]
    assert EngineProfile.from_dict(json.loads(json.dumps(profile()))).frontend_cpu_s == 0.0


def _probe_rows(requests) -> list[dict]:
    """Simulated rows as the replayer writes them (the fit reads these fields)."""
    return [{"status": "ok", "error": None, "sent_s": r["sent_s"], "first_token_s": r["first_token_s"],
             "last_token_s": r["last_token_s"], "input_tokens": r["input_tokens"],
             "server_input_tokens": r["input_tokens"], "token_times": r["token_times"]}
            for r in requests]


@pytest.mark.parametrize("frontend", [0.0, 0.003, 0.008])
def test_the_interference_observation_fits_the_term_back(tmp_path: Path, frontend: float):
    """The probe's pair (8 decoding, then the same with an arrival of 256 tokens every 8 steps) simulated
    on a known profile: the observation's measured mean step equals its features times the true
    coefficients (within 1%: the arrivals at the window's edges), so the fit recovers the term."""
    truth = {**STEP, "per_attn_s": 2e-8, "per_kv_s": 1e-6}
    prof = {**profile(frontend), "step": truth}
    b, tokens, prompt = 8, 160, 256
    control = trace_table(np.zeros(b), INTERFERENCE_CONTEXT, tokens)
    ctl = _rows(tmp_path, "ctl", control, prof)
    t0 = max(r["first_token_s"] for r in ctl)
    t1 = min(r["last_token_s"] for r in ctl)
    n = (tokens - 4) // 8
    arrivals = t0 + (t1 - t0) * (np.arange(n) + 0.5) / n
    loaded = trace_table(np.concatenate([np.zeros(b), arrivals]), [INTERFERENCE_CONTEXT] * b + [prompt] * n,
                         [tokens] * b + [2] * n)
    params = {"batch": b, "context": INTERFERENCE_CONTEXT, "tokens": tokens, "prompt": prompt, "pair": 0}
    obs = interference_observation(ProbeRun("interference", {**params, "arrivals": 0}, _probe_rows(ctl)),
                                   ProbeRun("interference", {**params, "arrivals": n},
                                            _probe_rows(_rows(tmp_path, "loaded", loaded, prof))),
                                   ENGINE["max_num_batched_tokens"])
    assert obs is not None and obs.features[UNKNOWNS.index("frontend_cpu_s")] > 0.05
    theta = np.array([*(truth[k] for k in ("base_s", "per_token_s", "per_sample_s", "per_attn_s", "per_kv_s")),
                      OVERHEAD_S, 0.0, frontend])
    assert float(obs.features @ theta) == pytest.approx(obs.measured_s, rel=0.01)
    # the term alone, from the observation less its step features: within 10% of a step's worth
    k = UNKNOWNS.index("frontend_cpu_s")
    got = (obs.measured_s - float(obs.features[:k] @ theta[:k])) / obs.features[k]
    assert got == pytest.approx(frontend, abs=0.1 * DECODE_S)


def test_both_cores_agree_with_the_frontend_term(tmp_path: Path):
    """The compiled core (this process, where built) and the pure one (a subprocess) give the same rows
    with the term on and jitter drawn (tests/test_compiled_core.py does the presets, which have no profile)."""
    import os
    import subprocess
    import sys

    from llmlb_bench import compiled_core

    if not compiled_core.current().compiled:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the compiled simulator core: {compiled_core.current().why}")
        pytest.skip("no compiled simulator core")
    code = ("import sys, json; from pathlib import Path; sys.path.insert(0, sys.argv[2]); "
            "from tests.test_frontend_cpu import _mixed_rows; print(json.dumps(_mixed_rows(Path(sys.argv[1]))))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "py"), str(root)], check=True, timeout=300,
                         env={**os.environ, "LLMLB_CORE": "python"}, capture_output=True, text=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == json.loads(json.dumps(_mixed_rows(tmp_path / "compiled")))


def _mixed_rows(tmp_path: Path) -> list[dict]:
    """120 Poisson-ish requests on a jittered, drifting profile with the frontend term (both cores run this)."""
    jitter = {"sigma": 0.2, "slow_rate_hz": 2.0, "slow_mean_s": 0.01, "slow_factor": 3.0, "drift_sigma": 0.2,
              "drift_period_s": 0.5}
    rng = np.random.default_rng(5)
    n = 120
    trace = trace_table(np.cumsum(rng.exponential(0.02, n)), rng.integers(20, 600, n), rng.integers(2, 80, n))
    rows = _rows(tmp_path, "mixed", trace, profile(0.004, jitter=jitter), seed=2)
    return [{k: r[k] for k in ("request_id", "first_token_s", "last_token_s")} for r in rows]


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_the_arrivals_wait_share_of_the_term_and_the_batch_pays_all(tmp_path: Path, share: float):
    """frontend_wait_share s: the step the arriving request waits behind takes s x frontend_cpu_s, the
    step after its first token the rest. B (one output token) gets its first token s x f later than with
    the whole overhead as a delay; A, decoding, still finishes f later; s = 1 is the profile without
    the field, row for row."""
    f = 2 * DECODE_S
    trace = trace_table([0.0, 0.1003], [100, 100], [200, 1])
    (a0, b0), (a1, b1) = (_rows(tmp_path, "delay", trace, profile()),
                          _rows(tmp_path, "split", trace, profile(f, frontend_wait_share=share)))
    assert b1["first_token_s"] - b0["first_token_s"] == pytest.approx(share * f, abs=1e-9)
    assert a1["last_token_s"] - a0["last_token_s"] == pytest.approx(f, abs=1e-9)
    if share == 1.0:
        assert _rows(tmp_path, "field", trace, profile(f, frontend_wait_share=1.0)) == \
            _rows(tmp_path, "absent", trace, profile(f))


@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
def test_wait_share_reads_back_the_share_that_made_the_rows(share: float):
    """The interference probe's run with arrivals, its rows made by the simulator with a known share:
    calibrate/frontend.py's share, from those rows against the simulator with the whole term and
    without it, is that share (within 0.1: the made rows are one draw of the arrivals' phases)."""
    from llmlb_bench.calibrate.frontend import wait_share
    from llmlb_bench.sim.profile import parse_profile

    b, n, tokens = 8, 100, 1000        # one arrival per ~10 steps of the batch, as calibrate's probe sends them
    arrivals = np.sort(np.random.default_rng(1).uniform(0.05, 8.5, n))      # at any phase of the steps
    table = trace_table(np.concatenate([np.zeros(b), arrivals]), [INTERFERENCE_CONTEXT] * b + [200] * n,
                        [tokens] * b + [2] * n)
    made = parse_profile(profile(0.006, frontend_wait_share=share))
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        rows = _rows(Path(tmp), "made", table, dict(made))
    run = ProbeRun("interference", {"batch": b, "context": INTERFERENCE_CONTEXT, "tokens": tokens, "prompt": 200,
                                    "pair": 0, "arrivals": n}, rows, 0.0, table)
    got = wait_share([run], parse_profile(profile(0.006)))
    assert got["arrivals"] == n and got["share"] == pytest.approx(share, abs=0.1), got


def test_a_share_outside_0_to_1_is_a_one_line_error():
    with pytest.raises(UserError, match="frontend_wait_share: must be a number from 0 to 1"):
        EngineProfile.from_dict(profile(0.006, frontend_wait_share=1.5))
