"""Step-time jitter drawn from a measured profile (sim/jitter.py): the simulated inter-token gaps
follow the profile's lognormal and slow phases (checked against theory), the draws are seeded
and kept apart from the run's other random streams, and without jitter nothing changes."""

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
from llmlb_bench.sim.jitter import JitterSpec, StepJitter
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


def test_jitter_is_seeded_and_per_replica(tmp_path: Path):
    cfg = ClusterConfig.build(replicas=2).with_profile(profile({"sigma": 0.2, "slow_rate_hz": 1.0,
                                                                 "slow_mean_s": 0.02, "slow_factor": 2.0}))
    trace = trace_table(np.arange(40) * 0.05, 200, 60)
    a, _, _ = run_sim(tmp_path, trace, cfg, seed=1, run_id="a")
    b, _, _ = run_sim(tmp_path, trace, cfg, seed=1, run_id="b")
    c, _, _ = run_sim(tmp_path, trace, cfg, seed=2, run_id="c")
    assert a.drop(["run_id"]).equals(b.drop(["run_id"]))
    assert not a.column("last_token_s").equals(c.column("last_token_s"))
    # two replicas draw from streams of their own: their first steps differ
    r0, r1 = StepJitter(JitterSpec(sigma=0.2), 1, 0), StepJitter(JitterSpec(sigma=0.2), 1, 1)
    assert [r0.factor(0.0) for _ in range(3)] != [r1.factor(0.0) for _ in range(3)]


def test_without_jitter_outputs_are_unchanged(tmp_path: Path):
    """A profile without a jitter table (version 1 or 2), one whose jitter is all zero, and a
    profile with jitter in a cluster that turns it off all give the very same rows."""
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
                       ({"slow_rate_hz": 1.0}, "jitter.slow_mean_s"), ([1], "jitter")):
        with pytest.raises(UserError, match=where):
            EngineProfile.from_dict(profile(bad))
