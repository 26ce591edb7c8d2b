"""The step spread ``llmlb calibrate`` measures (calibrate/dispersion.py): known lognormal jitter
and planted slow phases are recovered from decode windows; a known drift of the engine's speed
(an Ornstein-Uhlenbeck log speed, what sim/jitter.py draws) from repeated windows; against
``llmlb serve`` running a profile with jitter, calibrate gives the jitter back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmlb_bench.calibrate.dispersion import DriftSample, dispersion, drift, drift_sample
from llmlb_bench.policies import make_policy
from llmlb_bench.serve import ServeOptions
from llmlb_bench.sim import ClusterConfig
from tests.calibrate_helpers import server_rows
from tests.conftest import cli
from tests.serve_helpers import ServeThread


def test_lognormal_steps_give_back_their_sigma():
    """3,000 steps of 10 ms x exp(0.15 Z) in 60 windows: the robust sigma's standard error is
    about 2.5% here (plus a 1.5% upward bias from each window's own median), the tolerance 10%;
    no step is four sigmas out, so no slow phase."""
    rng = np.random.default_rng(1)
    windows = [0.01 * np.exp(0.15 * rng.standard_normal(50)) for _ in range(60)]
    got = dispersion(windows)
    assert got["sigma"] == pytest.approx(0.15, rel=0.10)
    assert (got["slow_phases"], got["slow_rate_hz"], got["slow_factor"], got["steps"], got["windows"]) == (
        0, 0.0, 1.0, 3000, 60)


def test_planted_slow_phases_are_found_with_their_rate_length_and_factor():
    """In 20 of 60 windows three consecutive steps are 4x slower: 20 phases, each 3 x 40 ms long
    (x the lognormal's mean, 1.011 at sigma 0.15), 4x slower than the median, over the windows'
    other steps' time."""
    rng = np.random.default_rng(2)
    windows = []
    for k in range(60):
        w = 0.01 * np.exp(0.15 * rng.standard_normal(50))
        if k % 3 == 0:
            w[20:23] *= 4
        windows.append(w)
    got = dispersion(windows)
    assert got["slow_phases"] == 20
    normal = sum(float(w.sum()) for w in windows) - 20 * 3 * 0.04 * np.exp(0.15 ** 2 / 2)
    assert got["slow_rate_hz"] == pytest.approx(20 / normal, rel=0.05)
    assert got["slow_mean_s"] == pytest.approx(0.12 * np.exp(0.15 ** 2 / 2), rel=0.05)
    assert got["slow_factor"] == pytest.approx(4 * np.exp(0.15 ** 2 / 2), rel=0.05)
    assert got["sigma"] == pytest.approx(0.15, rel=0.12)


def drifting_windows(rng: np.random.Generator, sigma: float, period_s: float, span_s: float, n: int,
                     groups: int = 5, steps: int = 48, jitter: float = 0.1) -> list[DriftSample]:
    """``n`` decode windows at random times over ``span_s``, each repeating one of ``groups`` probes
    (median steps 4, 8, ... ms), each of ``steps`` lognormal steps (``jitter``) around its probe's
    step times the engine's speed factor at its time: exp of an Ornstein-Uhlenbeck path of
    stationary sd ``sigma`` and correlation time ``period_s``, drawn exactly at those times."""
    times = np.sort(rng.uniform(0.0, span_s, n))
    x = np.empty(n)
    x[0] = sigma * rng.standard_normal()
    for i in range(1, n):
        a = np.exp(-(times[i] - times[i - 1]) / period_s)
        x[i] = x[i - 1] * a + sigma * np.sqrt(1 - a * a) * rng.standard_normal()
    out = []
    for t, xi, g in zip(times, x, rng.integers(0, groups, n)):
        sample = drift_sample(f"g{g}", float(t), 0.004 * (1 + g) * np.exp(xi + jitter * rng.standard_normal(steps)))
        assert sample is not None
        out.append(sample)
    return out


def test_a_known_drift_is_read_back():
    """Twenty calibrations' worth of windows (300 each over 200 s; a 0.15 log sd, an 8 s correlation
    time, steps scattered 0.1 around each window's median): the median over the twenty of the
    estimated sigma is within 10% of the truth and of the period within a factor 1.5 (one
    calibration's own estimates scatter more: the period trades off against sigma where the pairs
    are few, docs/fidelity.md)."""
    got = [drift(drifting_windows(np.random.default_rng(k), 0.15, 8.0, 200.0, 300)) for k in range(20)]
    assert float(np.median([g["drift_sigma"] for g in got])) == pytest.approx(0.15, rel=0.10)
    assert 8.0 / 1.5 <= float(np.median([g["drift_period_s"] for g in got])) <= 8.0 * 1.5
    assert all(g["drift_windows"] == 300 and 190 < g["drift_span_s"] <= 200 for g in got)


def test_without_drift_the_windows_own_noise_is_not_read_as_drift():
    """The same windows with a constant speed: each median's sampling noise (about 0.018 in log
    at 48 steps of sigma 0.1) is subtracted, so the drift read is at most a small fraction of it."""
    got = [drift(drifting_windows(np.random.default_rng(k), 0.0, 1.0, 60.0, 100))["drift_sigma"] for k in range(20)]
    assert float(np.median(got)) <= 0.005 and max(got) <= 0.02, got


def test_calibrate_reads_back_the_drift_the_simulator_draws(tmp_path: Path):
    """The chain end to end, with a known answer: the simulator draws a drift (log sd 0.2,
    correlation time 5 s, per-step sigma 0.1 on top) while 200 probes, one a second, alternate
    between two decode groups (4 requests of 16 prompt tokens, 2 of 64; 40 tokens each); their
    rows, as calibrate's probe runs, give drift samples (fit.drift_samples: the window, its time,
    its group) and the estimate. One path of 200 s scatters the estimate (its sigma by about 20%,
    its period by 2-4x: a drift is a random path, and 40 periods are few), so the median of six
    paths is held to 25% for sigma and a factor 2 for the period."""
    from llmlb_bench.calibrate.fit import drift_samples
    from llmlb_bench.calibrate.probes import ProbeRun
    from llmlb_bench.schema import trace_table
    from tests.sim_helpers import run_sim
    from tests.test_jitter import profile

    cfg = ClusterConfig.build(replicas=1).with_profile(profile({"sigma": 0.1, "drift_sigma": 0.2,
                                                                 "drift_period_s": 5.0}))
    sizes = [(4, 16) if k % 2 == 0 else (2, 64) for k in range(200)]
    arrivals = np.concatenate([np.full(b, float(k)) for k, (b, _) in enumerate(sizes)])
    trace = trace_table(arrivals, [c for b, c in sizes for _ in range(b)], 40)
    got = []
    for seed in range(6):
        requests, _, _ = run_sim(tmp_path, trace, cfg, seed=seed, run_id=str(seed))
        rows = sorted(requests.to_pylist(), key=lambda r: r["request_id"])
        runs, first = [], 0
        for k, (b, c) in enumerate(sizes):
            mine = [{"status": "ok", "sent_s": r["sent_s"], "first_token_s": r["first_token_s"],
                     "last_token_s": r["last_token_s"], "input_tokens": r["input_tokens"],
                     "token_times": r["token_times"]} for r in rows[first:first + b]]
            first += b
            # the prober's clock: the probe started when its requests were sent (k seconds); a group repeats every 2 s
            runs.append(ProbeRun("drift", {"batch": b, "context": c, "tokens": 40}, mine, float(k)))
        got.append(drift(drift_samples(runs)))
    assert float(np.median([g["drift_sigma"] for g in got])) == pytest.approx(0.2, rel=0.25), got
    assert 2.5 <= float(np.median([g["drift_period_s"] for g in got])) <= 10.0, got
    assert all(g["drift_windows"] == 200 and g["drift_span_s"] == pytest.approx(198, abs=0.5) for g in got)


def test_drift_needs_repeated_windows():
    """Windows of probes that never repeat, or fewer than six pairs, measure no drift."""
    lone = [DriftSample(f"g{k}", float(k), float(k), 0.0) for k in range(10)]
    assert drift(lone) == {"drift_sigma": 0.0, "drift_period_s": 0.0, "drift_windows": 0, "drift_pairs": 0,
                           "drift_span_s": 0.0}
    few = [DriftSample("g", float(k), 0.3 * k, 0.0) for k in range(3)]
    assert drift(few)["drift_sigma"] == 0.0 and drift(few)["drift_pairs"] == 3
    assert drift_sample("g", 0.0, np.full(3, 0.01)) is None


def test_too_short_windows_measure_nothing():
    assert dispersion([np.full(3, 0.01)])["steps"] == 0
    assert dispersion([])["sigma"] == 0.0


@pytest.mark.slow
def test_calibrate_gives_back_the_jitter_llmlb_serve_draws(tmp_path: Path, capsys, monkeypatch):
    """llmlb serve draws each step's time from a profile with lognormal jitter of sigma 0.25 around
    a 20 ms decode step; llmlb calibrate probes it over HTTP. Calibrate's reading of the probes
    (the decode windows, the step fit, the spread) applied to the steps the server made reads sigma
    back within 0.17-0.35 (about 130 steps: the estimate's own standard error is 0.02), the step
    model's decode step (the median) within 15%, and no slow phase the profile does not have; and
    calibrate wrote the profile its reading of what the client saw gives.

    What the client sees beyond the server's steps is this machine's: its delivery delays add to the
    spread, and a server falling behind sends several steps' tokens in one chunk, which evens them
    out. The spread measured through HTTP is therefore not held to the profile's here (a loaded
    machine moved it by more than the estimate's error); docs/fidelity.md has figures."""
    from llmlb_bench import calibrate as calibrate_module
    from llmlb_bench.calibrate.fit import drift_samples, fit, observations
    from llmlb_bench.calibrate.probes import ProbeRun

    step = {"base_s": 0.018, "per_token_s": 1e-4, "per_sample_s": 1e-3, "per_attn_s": 0.0, "per_kv_s": 0.0}
    profile = {"llmlb_profile": 2, "step": step, "request_overhead_s": 0.0,
               "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "block_size": 32,
                          "num_kv_blocks": 2000, "max_model_len": 4096},
               "jitter": {"sigma": 0.25}}
    seen: list[list[ProbeRun]] = []

    def observing(runs: list[ProbeRun], budget: int) -> Any:
        seen.append(list(runs))
        return observations(runs, budget)
    monkeypatch.setattr(calibrate_module, "observations", observing)
    st = ServeThread(ClusterConfig.build(replicas=1).with_profile(profile), ServeOptions(port=0),
                     make_policy("round_robin"))
    ended: list = []
    st.server.fleet.on_end = ended.append     # on the server's thread: a list append is atomic
    try:
        out = tmp_path / "fit.json"
        code, stdout, err = cli(["calibrate", st.urls[0], "-o", str(out), "--max-num-seqs", "8", "--max-batched-tokens",
                                 "512", "--max-prompt", "256", "--batches", "1,4", "--contexts", "16",
                                 "--decode-tokens", "40", "--repeats", "2"], capsys)
        assert code == 0, err
    finally:
        st.close()
    assert "lognormal sigma" in stdout and "engine speed drift over" in stdout
    got = json.loads(out.read_text())
    assert got["llmlb_profile"] == 2
    [runs] = seen
    obs, notes, windows = observations(runs, 512)
    assert got["jitter"] == dispersion(windows, drift_samples(runs))
    assert got["step"] == pytest.approx({k: fit(obs, notes).coefficients[k] for k in got["step"]}, rel=1e-9, abs=1e-15)
    obs, notes, windows = observations(server_rows(ended, runs), 512)
    j = dispersion(windows)
    assert j["steps"] >= 120 and 0.17 <= j["sigma"] <= 0.35, j
    assert j["slow_phases"] <= 2, j
    s = fit(obs, notes).coefficients
    for b in (1, 4):
        fitted = s["base_s"] + (s["per_token_s"] + s["per_sample_s"]) * b + (s["per_attn_s"] + s["per_kv_s"]) * 40 * b
        assert fitted == pytest.approx(step["base_s"] + (step["per_token_s"] + step["per_sample_s"]) * b, rel=0.15)


def test_the_drift_reference_goes_first_last_and_evenly_between():
    """Prober.all sends the drift reference before the first probe, after the last and at even
    intervals between (``drift_probes`` in all), and the other probes in their usual order; without
    it (0) exactly the usual sequence."""
    from calibrate_helpers import SETTINGS, RecordingProber

    from llmlb_bench.calibrate.probes import ProbeRun, plan

    for n in (0, 2, 5):
        p = plan(SETTINGS, None, [1, 4], [16], 16, 2, interference=False, drift_probes=n)
        prober = RecordingProber()
        runs = prober.all(p)
        assert prober.sent[0] == "warmup"     # kept apart by its kind: refit (probes.kept_runs) leaves it out
        sent = prober.sent[1:]
        others = [k for k in sent if k != "drift"]
        assert others == ["cache"] * 2 * len(p.cache_blocks) + ["prefill"] + ["decode"] * 4 + ["mixed"] * 4
        assert sent.count("drift") == n and [r.kind for r in runs].count("drift") == n
        if n:
            assert sent[0] == sent[-1] == "drift"
            at = [i for i, k in enumerate(sent) if k == "drift"]
            gaps = np.diff(at)
            assert gaps.max() - gaps.min() <= 1, at
            assert all(isinstance(r, ProbeRun) and r.at_s >= 0 for r in runs)
