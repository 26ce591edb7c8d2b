"""Step-time jitter drawn from a measured profile (sim/jitter.py): the simulated inter-token gaps
follow the profile's lognormal and slow phases, the engine's speed drift its Ornstein-Uhlenbeck
law (checked against theory), the draws are seeded and kept apart from the run's other random
streams, and without jitter (or without drift) nothing changes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.stats import norm

from llmlb_bench.errors import UserError
from llmlb_bench.schema import trace_table
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.sim.jitter import JitterSpec, SpeedDrift, StepJitter
from llmlb_bench.sim.profile import EngineProfile
from tests.conftest import cli
from tests.sim_helpers import run_sim

#: a step that does not grow with context, so that every decode step's model time is the same 5 ms
STEP = {"base_s": 0.004, "per_token_s": 0.0, "per_sample_s": 0.001, "per_attn_s": 0.0, "per_kv_s": 0.0}
ENGINE = {"max_num_seqs": 16, "max_num_batched_tokens": 1024, "block_size": 32, "num_kv_blocks": 4000,
          "max_model_len": 100_000, "enable_prefix_caching": True}


def profile(jitter: dict | None = None, version: int = 2) -> dict:
    p = {"llmlb_profile": version, "engine": dict(ENGINE), "step": dict(STEP), "request_overhead_s": 0.0}
    if jitter is not None:
        p["jitter"] = jitter
    return p


def gaps(requests: pa.Table) -> np.ndarray:
    """Every inter-token gap of every request, from its token-time segments."""
    out = []
    for r in requests.to_pylist():
        t = np.sort(np.concatenate([s["start_s"] + s["gap_s"] * np.arange(s["count"]) for s in r["token_times"]]))
        out.append(np.diff(t))
    return np.concatenate(out)


def test_simulated_itl_quantiles_are_the_profiles_lognormal(tmp_path: Path):
    """One request decoding 4,000 tokens alone: each gap is the 5 ms model step times exp(sigma Z).
    The gaps' quantiles divided by the model step must be exp(sigma z_q); with 4,000 draws a
    quantile's standard error is under 1% here, the tolerance 3%. The mean step is the lognormal's
    mean, exp(sigma^2 / 2) times the median (so a median-fitted profile with jitter is slower on
    average than without: the slow steps' share)."""
    sigma = 0.25
    cfg = ClusterConfig.build(replicas=1).with_profile(profile({"sigma": sigma}))
    requests, _, _ = run_sim(tmp_path, trace_table([0.0], 100, 4000), cfg)
    g = gaps(requests) / 0.005
    assert g.size == 3999
    for q in (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95):
        assert np.quantile(g, q) == pytest.approx(math.exp(sigma * norm.ppf(q)), rel=0.03), q
    assert float(np.std(np.log(g))) == pytest.approx(sigma, rel=0.05)
    assert float(np.mean(g)) == pytest.approx(math.exp(sigma ** 2 / 2), rel=0.02)


def test_slow_phases_come_at_their_rate_and_last_their_mean():
    """Slow phases at 20 per second of normal time, 5 ms long on average, 3x slower, read on a
    grid of 0.25 ms over 440 s (8,000 phases: the time share's standard error is about 1.6%, the
    tolerance 6%). The time inside them is D / (1 / rate + D) = 1/11 of the whole; phases shorter
    than the grid step can fall between two points (a share of 1 - (D / dt)(1 - exp(-dt / D))
    = 2.4% of them), so the count seen is the rate times the time outside them, less those."""
    rate, mean, dt = 20.0, 0.005, 2.5e-4
    jit = StepJitter(JitterSpec(slow_rate_hz=rate, slow_mean_s=mean, slow_factor=3.0), seed=5, replica=0)
    f = np.array([jit.factor(t) for t in np.arange(0.0, 440.0, dt)])
    assert set(np.unique(f)) == {1.0, 3.0}
    slow = f > 1
    share = float(slow.mean())
    phases = int(np.count_nonzero(slow[1:] & ~slow[:-1]) + slow[0])
    assert share == pytest.approx(mean / (1 / rate + mean), rel=0.06)
    missed = 1 - (mean / dt) * (1 - math.exp(-dt / mean))
    assert phases / (440.0 * (1 - share)) == pytest.approx(rate * (1 - missed), rel=0.06)
    assert share * 440.0 / phases == pytest.approx(mean / (1 - missed), rel=0.06)


def test_drift_log_factor_has_its_stationary_law_and_correlation():
    """4,000 replicas' drifts (sigma 0.2, period 5 s): the log factor at the start and five
    seconds later has mean 0 and variance sigma^2 (stationary; standard errors 0.003 and 2.2%,
    tolerances 0.012 and 8%), and the correlation of the two is exp(-1) (standard error 0.013,
    tolerance 0.04), whether the five seconds are crossed in one draw or in 50 unequal ones (the
    update is exact, not a discretisation)."""
    sigma, period = 0.2, 5.0
    at_0, one, many = [], [], []
    for replica in range(4000):
        a, b = SpeedDrift(sigma, period, 7, replica), SpeedDrift(sigma, period, 7, replica)
        at_0.append(a.log_factor(0.0))
        assert b.log_factor(0.0) == at_0[-1]
        one.append(a.log_factor(period))
        for t in np.sort(np.random.default_rng(replica).uniform(0.0, period, 49)):
            b.log_factor(float(t))
        many.append(b.log_factor(period))
    x0 = np.array(at_0)
    assert abs(float(x0.mean())) < 0.012 and float(x0.var()) == pytest.approx(sigma ** 2, rel=0.08)
    for x1 in (np.array(one), np.array(many)):
        assert abs(float(x1.mean())) < 0.012 and float(x1.var()) == pytest.approx(sigma ** 2, rel=0.08)
        assert float(np.corrcoef(x0, x1)[0, 1]) == pytest.approx(math.exp(-1.0), abs=0.04)


def test_a_slow_drift_spreads_whole_replays_by_its_sigma(tmp_path: Path):
    """A drift much slower than a request (sigma 0.2, period 1,000 s) is a speed factor per
    replica: 200 replicas each decode one request of 100 tokens, and the log of the requests'
    TPOT over the 5 ms model step has mean 0 (standard error 0.014, tolerance 0.05) and standard
    deviation sigma (standard error 5%, tolerance 15%): the spread between whole runs that the
    per-step jitter, averaged over a run's steps, cannot give."""
    drift = {"drift_sigma": 0.2, "drift_period_s": 1000.0}
    cfg = ClusterConfig.build(replicas=200).with_profile(profile(drift))
    requests, _, _ = run_sim(tmp_path, trace_table(np.zeros(200), 16, 100), cfg, policy="round_robin")
    rows = requests.to_pylist()
    tpot = np.array([(r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in rows])
    log = np.log(tpot / 0.005)
    assert abs(float(log.mean())) < 0.05
    assert float(log.std()) == pytest.approx(0.2, rel=0.15)
    assert len({r["target"] for r in rows}) == 200


def test_drift_draws_apart_from_the_step_draws():
    """With drift on, each step's factor is the very draw it was without drift, times the drift's
    factor at that time (the drift's stream is its own); a drift of sigma 0 makes no drift at all."""
    plain = StepJitter(JitterSpec(sigma=0.2), 3, 1)
    drifting = StepJitter(JitterSpec(sigma=0.2, drift_sigma=0.3, drift_period_s=2.0), 3, 1)
    alone = SpeedDrift(0.3, 2.0, 3, 1)
    for t in np.arange(0.0, 10.0, 0.013):
        assert drifting.factor(float(t)) == pytest.approx(plain.factor(float(t)) * alone.factor(float(t)), rel=1e-12)
    assert not JitterSpec(drift_sigma=0.0, drift_period_s=5.0).active
    assert JitterSpec(drift_sigma=0.1, drift_period_s=5.0).active


def test_jitter_is_seeded_and_per_replica(tmp_path: Path):
    cfg = ClusterConfig.build(replicas=2).with_profile(profile({"sigma": 0.2, "slow_rate_hz": 1.0,
                                                                 "slow_mean_s": 0.02, "slow_factor": 2.0,
                                                                 "drift_sigma": 0.2, "drift_period_s": 0.5}))
    trace = trace_table(np.arange(40) * 0.05, 200, 60)
    a, _, _ = run_sim(tmp_path, trace, cfg, seed=1, run_id="a")
    b, _, _ = run_sim(tmp_path, trace, cfg, seed=1, run_id="b")
    c, _, _ = run_sim(tmp_path, trace, cfg, seed=2, run_id="c")
    assert a.drop(["run_id"]).equals(b.drop(["run_id"]))
    assert not a.column("last_token_s").equals(c.column("last_token_s"))
    # two replicas draw from streams of their own: their first steps differ
    r0, r1 = StepJitter(JitterSpec(sigma=0.2), 1, 0), StepJitter(JitterSpec(sigma=0.2), 1, 1)
    assert [r0.factor(0.0) for _ in range(3)] != [r1.factor(0.0) for _ in range(3)]
    d0, d1 = SpeedDrift(0.2, 1.0, 1, 0), SpeedDrift(0.2, 1.0, 1, 1)
    assert d0.log_factor(0.0) != d1.log_factor(0.0)


def test_without_jitter_outputs_are_unchanged(tmp_path: Path):
    """A profile without a jitter table (version 1 or 2), one whose jitter is all zero, and a
    profile with jitter in a cluster that turns it off all give the very same rows; and a jitter
    table without drift fields gives the rows it gives with drift_sigma 0 (old profiles keep
    their outputs)."""
    trace = trace_table(np.arange(30) * 0.02, 300, 50)
    runs = [run_sim(tmp_path, trace, ClusterConfig.build(replicas=2).with_profile(p), seed=3, run_id=str(k))[0]
            for k, p in enumerate([profile(version=1), profile(), profile({"sigma": 0.0, "slow_rate_hz": 0.0})])]
    off = ClusterConfig.build(replicas=2, jitter=False).with_profile(profile({"sigma": 0.3}))
    runs.append(run_sim(tmp_path, trace, off, seed=3, run_id="off")[0])
    on = ClusterConfig.build(replicas=2).with_profile(profile({"sigma": 0.3}))
    jittered = run_sim(tmp_path, trace, on, seed=3, run_id="on")[0]
    for r in runs[1:]:
        assert r.drop(["run_id"]).equals(runs[0].drop(["run_id"]))
    assert not jittered.column("last_token_s").equals(runs[0].column("last_token_s"))
    no_drift = [run_sim(tmp_path, trace, ClusterConfig.build(replicas=2).with_profile(profile(j)), seed=3,
                        run_id=f"d{k}")[0]
                for k, j in enumerate([{"sigma": 0.3}, {"sigma": 0.3, "drift_sigma": 0.0},
                                       {"sigma": 0.3, "drift_sigma": 0.0, "drift_period_s": 4.0}])]
    for r in [*no_drift, jittered]:
        assert r.drop(["run_id"]).equals(no_drift[0].drop(["run_id"]))
    drifting = ClusterConfig.build(replicas=2).with_profile(profile({"sigma": 0.3, "drift_sigma": 0.2,
                                                                     "drift_period_s": 4.0}))
    assert not run_sim(tmp_path, trace, drifting, seed=3, run_id="drift")[0].column("last_token_s").equals(
        jittered.column("last_token_s"))


def test_jitter_leaves_the_other_random_streams_alone(tmp_path: Path):
    """Random failures (mtbf_s) come from the run's seed: with jitter on, replicas fail at the very
    same times as without it."""
    trace = trace_table(np.arange(200) * 0.05, 100, 30)
    base = {"replicas": 2, "mtbf_s": 3.0, "mttr_s": 0.5}
    without, _, s0 = run_sim(tmp_path, trace, ClusterConfig.build(**base).with_profile(profile()), seed=4, run_id="a")
    with_, _, s1 = run_sim(tmp_path, trace, ClusterConfig.build(**base).with_profile(profile({"sigma": 0.3})),
                           seed=4, run_id="b")
    assert s0["failures"] and s0["failures"] == s1["failures"]


def test_no_jitter_flag_and_bad_jitter_tables(tmp_path: Path, capsys):
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(profile({"sigma": 0.3})))
    trace = tmp_path / "t.parquet"
    code, _, err = cli(["gen", "workloads/chat.toml", "-o", str(trace), "--requests", "20"], capsys)
    assert code == 0, err
    outs = {}
    for k, extra in enumerate([[], ["--no-jitter"]]):
        code, _, err = cli(["simulate", str(trace), "--profile", str(prof), "-r", str(tmp_path / f"r{k}"), *extra],
                           capsys)
        assert code == 0, err
        run = next((tmp_path / f"r{k}").glob("*/run.json"))
        outs[k] = (json.loads(run.read_text())["config"]["cluster"]["jitter"],
                   pq.read_table(run.parent / "requests.parquet").column("last_token_s").to_pylist())
    assert outs[0][0] is True and outs[1][0] is False and outs[0][1] != outs[1][1]
    for bad, where in (({"sigma": -1}, "jitter.sigma"), ({"slow_factor": 0.5}, "jitter.slow_factor"),
                       ({"slow_rate_hz": 1.0}, "jitter.slow_mean_s"), ([1], "jitter"),
                       ({"drift_sigma": 0.1}, "jitter.drift_period_s"), ({"drift_period_s": -1}, "jitter.drift_period_s")):
        with pytest.raises(UserError, match=where):
            EngineProfile.from_dict(profile(bad))
