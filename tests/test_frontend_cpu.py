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

from llmlb_bench.calibrate.fit import (UNKNOWNS, Observation, decode_features, frontend_per_arrival,
                                       interference_observation, prefill_features)
from llmlb_bench.calibrate.probes import INTERFERENCE_CONTEXT, ProbeRun
from llmlb_bench.errors import UserError
from llmlb_bench.schema import trace_table
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.profile import STEP_TERMS, EngineProfile
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
    theta = np.array([*(STEP.get(k, 0.0) for k in STEP_TERMS), OVERHEAD_S, 0.0, p.frontend_cpu_s])
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


def _pair(tmp_path: Path, prof: dict[str, object], name: str = "") -> Observation:
    """The interference probe's pair (8 decoding, then the same with an arrival of 256 tokens every 8
    steps) simulated on ``prof``: its observation (calibrate/fit.py)."""
    b, tokens, prompt = 8, 160, 256
    control = trace_table(np.zeros(b), INTERFERENCE_CONTEXT, tokens)
    ctl = _rows(tmp_path, f"ctl{name}", control, prof)
    t0 = max(r["first_token_s"] for r in ctl)
    t1 = min(r["last_token_s"] for r in ctl)
    n = (tokens - 4) // 8
    arrivals = t0 + (t1 - t0) * (np.arange(n) + 0.5) / n
    loaded = trace_table(np.concatenate([np.zeros(b), arrivals]), [INTERFERENCE_CONTEXT] * b + [prompt] * n,
                         [tokens] * b + [2] * n)
    params = {"batch": b, "context": INTERFERENCE_CONTEXT, "tokens": tokens, "prompt": prompt, "pair": 0}
    obs = interference_observation(ProbeRun("interference", {**params, "arrivals": 0}, _probe_rows(ctl)),
                                   ProbeRun("interference", {**params, "arrivals": n},
                                            _probe_rows(_rows(tmp_path, f"loaded{name}", loaded, prof))),
                                   ENGINE["max_num_batched_tokens"])
    assert obs is not None
    return obs


#: the step model of the interference tests: decode steps that depend on the context too
TRUTH = {**STEP, "per_attn_s": 2e-8, "per_kv_s": 1e-6}


def _theta(step: dict[str, float], frontend: float) -> np.ndarray:
    return np.array([*(step.get(k, 0.0) for k in STEP_TERMS), OVERHEAD_S, 0.0, frontend])


@pytest.mark.parametrize("frontend", [0.0, 0.003, 0.008])
def test_the_interference_observation_fits_the_term_back(tmp_path: Path, frontend: float):
    """The probe's pair simulated on a known profile: the observation's measured mean step equals its
    features times the true coefficients (within 1%: the arrivals at the window's edges), so the pair
    reads the term back."""
    obs = _pair(tmp_path, {**profile(frontend), "step": TRUTH})
    assert obs.features[UNKNOWNS.index("frontend_cpu_s")] > 0.05
    theta = _theta(TRUTH, frontend)
    assert float(obs.features @ theta) == pytest.approx(obs.measured_s, rel=0.01)
    # the term alone, from the pair against its control: within 10% of a step's worth; the engine ran at
    # the model's speed (the control's median step is the model's, within the window's context rounding)
    got, speed = frontend_per_arrival(obs, theta)
    assert got == pytest.approx(frontend, abs=0.1 * DECODE_S) and speed == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("slower", [0.7, 1.3, 1.6])
def test_a_pair_sent_in_a_slower_or_faster_spell_reads_the_term_against_its_control(tmp_path: Path, slower: float):
    """The engine ran ``slower`` x the step model's speed while the pair was sent (its steps and its
    frontend's work alike: one core). Read against its control (calibrate/fit.py), the batch's decodes
    are taken at the control's speed, which is the spell's, and the arrivals' own steps at the model's:
    the reading is the term plus (1 - 1 / slower) x the arrivals' steps per arrival, exactly as the
    estimator says (here costly 256-token prefills, 27 ms each: on vLLM CPU they are a few ms). Read
    against the step model alone (the estimate before 2026-12-02) the batch's whole slowdown landed on
    the term: (slower - 1) x its 8 decode steps per arrival, several times more."""
    frontend = 0.005
    during = {**profile(frontend * slower), "step": {k: v * slower for k, v in TRUTH.items()}}
    obs = _pair(tmp_path, during)
    theta = _theta(TRUTH, frontend)
    got, speed = frontend_per_arrival(obs, theta)
    assert speed == pytest.approx(slower, rel=0.01)
    assert obs.control is not None
    k = UNKNOWNS.index("frontend_cpu_s")
    per_arrival = 1 / obs.features[k]
    own = float((obs.features[:k] - obs.control[2][:k]) @ theta[:k]) * per_arrival      # the arrivals' steps
    assert got == pytest.approx(frontend + (1 - 1 / slower) * own, abs=0.1 * DECODE_S)
    batch = float(obs.control[2][:k] @ theta[:k]) * per_arrival                         # the batch's decodes
    without_control = (obs.measured_s - float(obs.features[:k] @ theta[:k])) / obs.features[k]
    assert without_control == pytest.approx(slower * frontend + (slower - 1) * (batch + own), rel=0.03)
    assert abs(got - frontend) < 0.5 * abs(without_control - frontend)


def test_the_term_is_the_median_of_the_pairs_each_against_its_own_control(tmp_path: Path):
    """Three pairs sent in a slow spell (1.2-1.6 x the speed of the decode and prefill observations,
    which are exact): the fit's other terms are those observations' (the pairs take no part in the least
    squares), the term is the median of the three readings, in the step model's time, each pair's
    prediction is the model at its control's speed, and the reading without the controls, which takes the
    spell for frontend time, is reported beside it."""
    from llmlb_bench.calibrate.fit import fit

    frontend = 0.004
    theta = _theta(TRUTH, frontend)
    obs = [Observation("prefill", f"prompt {p}", f, float(f @ theta))
           for p in (50, 300, 900, 2000) for f in [prefill_features(p, 0, ENGINE["max_num_batched_tokens"])]]
    obs += [Observation("cache", f"prompt {p}, {c} cached", f, float(f @ theta))
            for p, c in ((520, 512), (1032, 1024)) for f in [prefill_features(p, c, ENGINE["max_num_batched_tokens"])]]
    obs += [Observation("decode", f"batch {b}, context {c}", f, float(f @ theta))
            for b in (1, 4, 16) for c in (16, 800) for f in [decode_features(b, b * c)]]
    pairs = [_pair(tmp_path, {**profile(frontend * s), "step": {k: v * s for k, v in TRUTH.items()}}, f"-{s}")
             for s in (1.2, 1.6, 1.4)]
    result = fit(obs + pairs, [])
    for k in ("base_s", "per_token_s", "per_sample_s", "per_kv_s", "request_overhead_s"):
        assert result.coefficients[k] == pytest.approx(theta[UNKNOWNS.index(k)], rel=1e-6, abs=1e-12), k
    assert result.frontend is not None
    readings = [frontend_per_arrival(o, np.array([result.coefficients[k] for k in UNKNOWNS]))[0] for o in pairs]
    assert result.coefficients["frontend_cpu_s"] == pytest.approx(float(np.median(readings)), rel=1e-9)
    assert result.frontend["pairs_ms"] == pytest.approx([1e3 * r for r in readings], abs=1e-3)
    assert result.frontend["speeds"] == pytest.approx([1.2, 1.6, 1.4], rel=0.01)
    assert abs(result.coefficients["frontend_cpu_s"] - frontend) < 0.5 * abs(
        1e-3 * result.frontend["without_control_ms"] - frontend)            # the 1.4x pair's spell on the term
    for o in pairs:
        assert o.predicted_s / o.measured_s == pytest.approx(1.0, abs=0.05) and not o.in_fit


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


def test_the_interference_pairs_are_counted_apart_from_the_repeats():
    """``interference_pairs`` sets how many interference pairs a calibration sends, whatever the other
    probes' ``repeats`` (None: as many as ``repeats``, the default); the plan's request count and the
    probes sent (pair 0, 1, ... in order, after every other probe) follow it."""
    from calibrate_helpers import SETTINGS, RecordingProber

    from llmlb_bench.calibrate.probes import plan

    default = plan(SETTINGS, None, [1, 4], [16], 16, 3, drift_probes=0)
    nine = plan(SETTINGS, None, [1, 4], [16], 16, 3, drift_probes=0, interference_pairs=9)
    assert default.pairs == 3 and nine.pairs == 9 and nine.repeats == 3
    per_pair = 2 * default.interference_batch + default.interference_tokens // 8
    assert default.interference_requests() == 3 * per_pair and nine.interference_requests() == 9 * per_pair
    assert nine.requests() - default.requests() == 6 * per_pair
    for p in (default, nine):
        prober = RecordingProber()
        runs = prober.all(p)
        assert prober.sent.count("interference") == p.pairs
        assert prober.sent[-p.pairs:] == ["interference"] * p.pairs
        assert [r.params["pair"] for r in runs if r.kind == "interference"] == list(range(p.pairs))
        assert prober.sent.count("decode") == 2 * p.repeats          # the other probes keep their repeats
