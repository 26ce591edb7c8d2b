"""The coarse environment (learn/admission.py): one decision per interval with arrivals, the limit it sets
holds in the simulator's rows, no limit is the inner policy's own run, rewards are the goodput."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

gymnasium = pytest.importorskip("gymnasium")

from llmlb_bench.errors import UserError  # noqa: E402
from llmlb_bench.learn.admission import COARSE_FIELDS, AdmissionEnv  # noqa: E402
from llmlb_bench.policies import make_policy  # noqa: E402
from llmlb_bench.sim.simulation import simulate  # noqa: E402


def _run(env: AdmissionEnv, action: int, seed: int = 1):
    obs, info = env.reset(seed=seed)
    rewards, infos = [], [info]
    while True:
        obs, r, term, _, info = env.step(action)
        assert env.observation_space.contains(obs)
        rewards.append(r)
        infos.append(info)
        if term:
            return rewards, infos, info


def _max_concurrency(rows: pa.Table, target: str) -> int:
    """Most requests the router had in flight on ``target`` at once (sent until their last token)."""
    ok = rows.filter(pc.and_(pc.equal(rows.column("target"), target), pc.equal(rows.column("status"), "ok")))
    events = sorted([(t, 1) for t in ok.column("sent_s").to_pylist()]
                    + [(t, -1) for t in ok.column("last_token_s").to_pylist()], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_one_decision_per_interval_with_arrivals_and_the_limit_holds():
    env = AdmissionEnv("chat", requests=600, rate_scale=2.0, interval_s=2.0, limits=(2, 0), keep_rows=True,
                       slo="ttft=300ms")
    rewards, infos, last = _run(env, 0)
    trace, _ = env.episodes.trace(1)
    ticks = {math.floor(t / 2.0) for t in trace.column("arrival_s").to_pylist()}
    assert last["episode"]["decisions"] == len(ticks)
    rows = env.requests_table()
    assert 0 < last["episode"]["status"]["rejected"] < 600
    for target in ("r0", "r1", "r2", "r3"):
        assert _max_concurrency(rows, target) <= 2
    ttft = pc.subtract(rows.column("first_token_s"), rows.column("scheduled_s")).to_numpy(zero_copy_only=False)
    good = int(np.nansum(np.where(pc.equal(rows.column("status"), "ok").to_numpy(zero_copy_only=False),
                                  ttft <= 0.3, False)))
    assert sum(rewards) == pytest.approx(good)                     # slo_met: the goodput count
    paid = sorted(d for info in infos for d, _ in info.get("completed", []))
    assert len(paid) == 600 and set(paid) <= set(range(len(ticks)))


def test_no_limit_is_the_inner_policy_alone():
    env = AdmissionEnv("chat", requests=300, rate_scale=2.0, limits=(0,), keep_rows=True)
    _run(env, 0)
    got = env.requests_table().sort_by("request_id")

    class Sink:
        def __init__(self):
            self.batches = []

        def write(self, columns):
            self.batches.append(pa.table(dict(columns)))

    class Run:
        requests, series = Sink(), Sink()

    trace, seed = env.episodes.trace(1)
    run = Run()
    simulate(trace, env.cluster, make_policy("least_outstanding", {}, seed=1), run, seed=seed)
    want = pa.concat_tables(run.requests.batches, promote_options="default").sort_by("request_id")
    assert got.equals(want)


def test_observation_check_env_and_registry():
    from gymnasium.utils.env_checker import check_env

    env = AdmissionEnv("chat", requests=200, interval_s=1.0)
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert obs.shape == (len(COARSE_FIELDS),) and info["limit"] == 0
    obs, *_ = env.step(2)                     # limit 4 from the next arrival on
    assert obs[COARSE_FIELDS.index("limit")] == pytest.approx(math.log1p(4))
    assert obs[COARSE_FIELDS.index("arrivals_per_s")] > 0
    made = gymnasium.make("llmlb_bench.learn:llmlb/Admission-v0", workload="chat", requests=50)
    assert made.reset(seed=0)[0].shape == (len(COARSE_FIELDS),)


@pytest.mark.parametrize("kwargs,match", [
    ({"interval_s": 0}, "interval_s"),
    ({"limits": (4, -1)}, "limits"),
    ({"policy": "nope"}, "unknown policy"),
    ({"cluster": "clusters/disaggregated.toml"}, "disaggregated"),
])
def test_bad_settings_are_one_line(kwargs, match):
    with pytest.raises(UserError, match=match):
        AdmissionEnv("chat", requests=10, **kwargs)
