"""The gymnasium routing environment (learn/env.py): the same simulator as ``llmlb simulate`` (rows
identical under built-in policies acting through it, HOLD and REJECT included), rewards attributed to
decisions and checked against the simulator's own rows, deterministic seeded episodes, train/eval kept
apart, gymnasium's checker, registry and vector API, one-line refusals."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

gymnasium = pytest.importorskip("gymnasium")     # the `learn` extra (in the `test` extra, so CI has it)

from llmlb_bench.errors import UserError  # noqa: E402
from llmlb_bench.learn.env import PolicyAgent, RouteEnv  # noqa: E402
from llmlb_bench.learn.episodes import Episodes, generation_seed  # noqa: E402
from llmlb_bench.policies import make_policy  # noqa: E402
from llmlb_bench.schema import write_trace  # noqa: E402
from llmlb_bench.sim.simulation import simulate  # noqa: E402
from tests.conftest import cli  # noqa: E402


class _Sink:
    def __init__(self) -> None:
        self.batches: list[pa.Table] = []

    def write(self, columns) -> None:
        self.batches.append(pa.table(dict(columns)))


class _Run:
    def __init__(self) -> None:
        self.requests, self.series = _Sink(), _Sink()


def _episode(env: RouteEnv, act, seed: int = 0) -> tuple[list[float], list[dict], dict]:
    obs, info = env.reset(seed=seed)
    rewards, infos = [], [info]
    while True:
        obs, r, term, trunc, info = env.step(act(obs, info))
        assert env.observation_space.contains(obs)
        rewards.append(r)
        infos.append(info)
        if term:
            return rewards, infos, info


def _through_env(env: RouteEnv, policy: str, args: dict, seed: int = 3) -> pa.Table:
    agent = PolicyAgent(env, make_policy(policy, args, seed=5))
    _episode(env, lambda obs, info: agent.act(), seed)
    return env.requests_table().sort_by("request_id")


def _simulated(env: RouteEnv, policy: str, args: dict, seed: int = 3) -> pa.Table:
    trace, sim_seed = env.episodes.trace(seed)
    run = _Run()
    simulate(trace, env.cluster, make_policy(policy, args, seed=5), run, seed=sim_seed)
    return pa.concat_tables(run.requests.batches, promote_options="default").sort_by("request_id")


@pytest.mark.parametrize("workload,policy,args,exercises", [
    ("shared-prefix", "least_outstanding", {}, ""),
    ("shared-prefix", "cache_aware", {}, ""),        # predicted_cached_tokens recorded through the env too
    ("chat", "least_predicted_work", {"tau": 0.3}, ""),   # learns from on_complete
    ("chat", "fcfs_queue", {"max_outstanding": 2}, "held"),   # HOLD and release
    ("chat", "edf", {"max_outstanding": 3, "deadline_s": 0.3, "drop_late": True}, "dropped"),
    ("chat", "admission_control", {"max_outstanding": 3}, "refused"),   # REJECT
])
def test_a_builtin_policy_through_the_env_gives_the_rows_of_simulate(workload, policy, args, exercises):
    env = RouteEnv(workload, requests=250, rate_scale=2.0, hold=True, reject=True, keep_rows=True)
    got = _through_env(env, policy, args)
    want = _simulated(env, policy, args)
    assert got.num_rows == want.num_rows == 250
    # the case exercises what it says: requests held at the router, dropped from its queue, refused
    held = pc.sum(pc.greater(want.column("sent_s"), want.column("scheduled_s"))).as_py() or 0
    errors = [e or "" for e in want.column("error").to_pylist()]
    assert (held > 0) == (exercises in ("held", "dropped"))
    assert any("dropped by the router queue" in e for e in errors) == (exercises == "dropped")
    assert any("rejected by the router" in e for e in errors) == (exercises == "refused")
    assert got.equals(want)


def test_a_disaggregated_fleet_takes_a_pair_and_pd_pair_through_it_gives_the_rows_of_simulate():
    from gymnasium.utils.env_checker import check_env

    env = RouteEnv("chat", "clusters/disaggregated.toml", requests=150, rate_scale=0.5, reject=True,
                   keep_rows=True)
    check_env(env, skip_render_check=True)
    assert env.action_space.nvec.tolist() == [5, 4]          # 4 prefill choices + REJECT; 4 decode choices
    obs, _ = env.reset(seed=3)
    # r0, r1 are the prefill pool, r2, r3 the decode pool
    assert obs["action_mask"].tolist() == [1, 1, 0, 0, 1, 0, 0, 1, 1]
    got = _through_env(env, "pd_pair", {})
    want = _simulated(env, "pd_pair", {})
    assert set(want.column("prefill_target").to_pylist()) == {"r0", "r1"}
    assert got.equals(want)
    obs, _ = env.reset(seed=0)
    _, r, _, _, info = env.step([4, 0])                     # REJECT
    assert info["cost"]["failed"] == 1 and not info["invalid"]
    _, r, _, _, info = env.step([9, 0])                     # no such target: refused as REJECT
    assert info["invalid"]


def test_rows_equal_the_cli_simulate_run(tmp_path, capsys):
    env = RouteEnv("chat", requests=120, keep_rows=True)
    got = _through_env(env, "least_outstanding", {}, seed=4)
    trace, sim_seed = env.episodes.trace(4)
    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    code, out, err = cli(["simulate", str(path), "--seed", str(sim_seed), "--results", str(tmp_path / "r"),
                          "--run-id", "x", "--format", "json"], capsys)
    assert code == 0, err
    stored = pa.parquet.read_table(tmp_path / "r" / "x" / "requests.parquet").sort_by("request_id")
    for name in got.column_names:
        assert stored.column(name).to_pylist() == got.column(name).to_pylist(), name


def test_rewards_are_attributed_to_decisions_and_match_the_rows():
    """neg_latency: the episode's reward is minus the sum of end-to-end latencies the simulator wrote,
    each decision is paid exactly once, and costs count the SLO misses of the rows."""
    env = RouteEnv("chat", requests=200, rate_scale=3.0, slo="ttft=200ms", reward="neg_latency", keep_rows=True)
    rewards, infos, last = _episode(env, lambda obs, info: int(np.argmin(obs["targets"][:, 2])), seed=1)
    rows = env.requests_table()
    e2e = pc.subtract(rows.column("last_token_s"), rows.column("scheduled_s")).to_numpy()
    assert sum(rewards) == pytest.approx(-e2e.sum(), rel=1e-9)
    paid = [d for info in infos for d, _ in info.get("completed", [])]
    assert sorted(paid) == list(range(200))
    per_decision = dict(p for info in infos for p in info.get("completed", []))
    order = np.argsort(rows.column("request_id").to_numpy())
    # request i was decision i (no HOLD, no retries): its reward is minus its own latency
    np.testing.assert_allclose([per_decision[i] for i in range(200)], -e2e[order], rtol=1e-9)
    ttft = pc.subtract(rows.column("first_token_s"), rows.column("scheduled_s")).to_numpy()
    violations = sum(info["cost"]["slo_violation"] for info in infos[1:])
    assert violations == (ttft > 0.2).sum() > 0
    excess = sum(info["cost"]["ttft_excess_s"] for info in infos[1:])
    assert excess == pytest.approx(np.clip(ttft - 0.2, 0, None).sum(), rel=1e-9)
    assert last["episode"]["status"] == {"ok": 200}


def test_slo_met_sums_to_goodput_and_fairness_is_one_with_one_tenant():
    env = RouteEnv("chat", requests=150, rate_scale=3.0, slo="ttft=150ms,tpot=40ms", reward="slo_met,fairness=2",
                   keep_rows=True)
    rewards, infos, last = _episode(env, lambda obs, info: info.get("decision", 0) % 4, seed=2)
    rows = env.requests_table()
    ttft = pc.subtract(rows.column("first_token_s"), rows.column("scheduled_s")).to_numpy()
    out = rows.column("output_tokens").to_numpy()
    tpot = np.where(out > 1, (rows.column("last_token_s").to_numpy() - rows.column("first_token_s").to_numpy())
                    / np.maximum(out - 1, 1), 0.0)
    good = int(((ttft <= 0.15) & (tpot <= 0.04)).sum())
    assert 0 < good < 150
    assert last["episode"]["terms"]["fairness"] == 1.0
    assert sum(rewards) == pytest.approx(good + 2.0)


def test_reject_and_hold_until_the_end_are_failures():
    env = RouteEnv("chat", requests=40, reject=True, hold=True, reward="neg_latency", slo=None, failure_s=10.0,
                   keep_rows=True)
    rewards, infos, last = _episode(env, lambda obs, info: env.actions.reject_index)
    assert sum(rewards) == pytest.approx(-400.0)
    assert last["episode"]["status"] == {"rejected": 40}
    assert sum(info["cost"]["failed"] for info in infos[1:]) == 40
    rewards, infos, last = _episode(env, lambda obs, info: env.actions.hold_index)
    assert last["episode"]["status"] == {"not_sent": 40}
    assert sum(rewards) == pytest.approx(-400.0)
    assert any(info.get("release") for info in infos[:-1])   # held requests were offered again


def test_a_target_the_fleet_does_not_have_is_refused_as_reject():
    env = RouteEnv("chat", requests=10, max_targets=6, reward="neg_latency", slo=None)
    obs, info = env.reset(seed=0)
    assert obs["action_mask"].tolist() == [1, 1, 1, 1, 0, 0]
    assert obs["targets"][4:].sum() == 0
    obs, r, term, trunc, info = env.step(5)
    assert info["invalid"] and r == -60.0 and info["cost"]["failed"] == 1
    obs, r, term, trunc, info = env.step(-1)       # not HOLD, not REJECT: neither is an action here
    assert info["invalid"] and r == -60.0 and "router" not in obs


def test_same_seed_same_episode_other_seed_other_episode():
    env = RouteEnv("bursty", requests=60, reward="neg_ttft", slo=None)

    def trajectory(seed):
        obs, _ = env.reset(seed=seed)
        seen, rs = [obs["targets"].copy()], []
        for k in range(59):
            obs, r, term, *_ = env.step(k % 4)
            seen.append(obs["targets"].copy())
            rs.append(r)
        return np.stack(seen), rs

    a, ra = trajectory(7)
    b, rb = trajectory(7)
    c, _ = trajectory(8)
    np.testing.assert_array_equal(a, b)
    assert ra == rb
    assert not np.array_equal(a, c)
    # an episode abandoned half-way does not leak into the next
    env.reset(seed=7)
    env.step(0)
    d, rd = trajectory(7)
    np.testing.assert_array_equal(a, d)


def test_train_and_eval_never_share_a_generated_trace():
    train = {generation_seed(s, "train") for s in range(1000)}
    evals = {generation_seed(s, "eval") for s in range(1000)}
    assert not train & evals
    a = Episodes.from_source("chat", split="train", requests=50).trace(3)[0]
    b = Episodes.from_source("chat", split="eval", requests=50).trace(3)[0]
    assert a.column("input_tokens") != b.column("input_tokens")
    with pytest.raises(UserError, match="unknown split"):
        Episodes.from_source("chat", split="test")


def test_a_trace_file_is_cut_by_time_and_each_part_stands_alone(tmp_path):
    n = 100
    parent = [None] * n
    for i in range(1, n, 2):
        parent[i] = i - 1                      # every odd request waits for the one before
    table = pa.table({"request_id": pa.array(range(n), pa.int64()),
                      "arrival_s": pa.array([float(i) for i in range(n)]),
                      "input_tokens": pa.array([50] * n, pa.int32()), "output_tokens": pa.array([5] * n, pa.int32()),
                      "parent_id": pa.array(parent, pa.int64()),
                      "after_parent_s": pa.array([0.5 if p is not None else None for p in parent], pa.float64())})
    path = tmp_path / "t.parquet"
    write_trace(table, path)
    # the cut falls at 80.5 s, between request 80 and its child 81: 81 belongs to neither part
    fraction = 18.5 / 99
    train = Episodes.from_source(path, split="train", eval_fraction=fraction).table
    evals = Episodes.from_source(path, split="eval", eval_fraction=fraction).table
    tr, ev = set(train.column("request_id").to_pylist()), set(evals.column("request_id").to_pylist())
    assert tr == set(range(81)) and ev == set(range(82, 100))
    assert max(train.column("arrival_s").to_pylist()) < min(evals.column("arrival_s").to_pylist())
    for part, ids in ((train, tr), (evals, ev)):
        assert all(p is None or p in ids for p in part.column("parent_id").to_pylist())
    window, _ = Episodes.from_source(path, split="train", requests=21).trace(5)
    ids = set(window.column("request_id").to_pylist())
    assert all(p is None or p in ids for p in window.column("parent_id").to_pylist())
    assert min(window.column("arrival_s").to_pylist()) == 0.0
    env = RouteEnv(path, split="eval", reward="neg_latency", slo=None, eval_fraction=fraction)
    _, infos, last = _episode(env, lambda obs, info: 0)
    assert sum(last["episode"]["status"].values()) == evals.num_rows


def test_check_env_registry_and_vector_api():
    from gymnasium.utils.env_checker import check_env

    check_env(RouteEnv("chat", requests=30, hold=True, reject=True), skip_render_check=True)
    env = gymnasium.make("llmlb_bench.learn:llmlb/Route-v0", workload="chat", requests=20)
    obs, _ = env.reset(seed=0)
    assert obs["targets"].shape == (4, len(env.unwrapped.target_names))
    vec = gymnasium.vector.SyncVectorEnv([lambda: RouteEnv("chat", requests=15, reward="slo_met",
                                                           slo="ttft=10s") for _ in range(2)])
    vec.reset(seed=[1, 2])
    total = np.zeros(2)
    ends = np.zeros(2)
    for k in range(40):     # 15 decisions an episode: both sub-envs finish and reset on their own
        _, r, term, _, _ = vec.step(np.array([k % 4, (k + 1) % 4]))
        total += r
        ends += term
    assert (ends >= 2).all()
    assert (total >= 30).all()      # every request of two finished episodes met a 10 s TTFT


def test_gymnasium_make_finds_the_env_in_a_fresh_process():
    """gymnasium 1.x loads no plugin entry points: its ``module:id`` form imports llmlb_bench.learn, which
    registers the id because gymnasium is loaded by then."""
    import subprocess
    import sys

    code = ("import gymnasium; env = gymnasium.make('llmlb_bench.learn:llmlb/Route-v0', workload='chat', "
            "requests=5); obs, _ = env.reset(seed=0); print(obs['targets'].shape)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(4, 11)"


def test_observation_layout_names_every_field():
    env = RouteEnv("chat", requests=10, hold=True, reject=True, kinds=["chat", "code"], prefix_source="index")
    lay = env.observation_layout()
    assert lay["request"][-2:] == ["kind=chat", "kind=code"]
    assert lay["features"]["prefix_source"] == "index"
    assert lay["targets"]["columns"] == list(env.target_names)
    assert lay["actions"][-2:] == ["HOLD", "REJECT"]
    assert lay["features"]["format"] == "llmlb.features"
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"targets", "request", "router", "action_mask"}
    assert obs["request"].shape == (len(lay["request"]),)
    assert obs["request"][-2:].tolist() == [1.0, 0.0]        # the chat preset's requests are of kind chat


@pytest.mark.parametrize("kwargs,match", [
    ({"cluster": "clusters/disaggregated.toml", "hold": True}, "HOLD is not an action on a disaggregated"),
    ({"reward": "speed"}, "unknown reward term 'speed'"),
    ({"reward": "slo_met", "slo": None}, "needs an SLO"),
    ({"slo": "ttfa=1s"}, "cannot be measured"),
    ({"workload": "no-such-preset"}, "not a workload preset"),
    ({"fields": ["queue"]}, "unknown feature"),
    ({"reward": "slo_met=x"}, "cannot read weight"),
])
def test_bad_settings_are_one_line(kwargs, match):
    args = {"workload": "chat", "requests": 10, **kwargs}
    with pytest.raises(UserError, match=match) as exc:
        RouteEnv(**args)
    assert "\n" not in str(exc.value)


def test_reward_terms_against_hand_computed_values():
    from llmlb_bench.learn.rewards import Ended, Reward, zero_costs

    r = Reward.parse("slo_met=1,good_tokens=2,neg_latency=0.5,neg_ttft=1", "ttft=100ms;batch:e2e=10s",
                     failure_s=30.0)
    cost = zero_costs()
    fast = Ended("ok", "default", "a", 0.05, 2.0, 0.01, 500)
    assert r.ended(fast, cost) == pytest.approx(1 + 2 * 0.5 - 0.5 * 2.0 - 0.05)
    slow = Ended("ok", "default", "b", 0.3, 2.0, 0.01, 500)
    assert r.ended(slow, cost) == pytest.approx(-0.5 * 2.0 - 0.3)
    batch = Ended("ok", "batch", "b", 5.0, 9.0, 0.01, 100)      # the batch class has no TTFT limit
    assert r.ended(batch, cost) == pytest.approx(1 + 0.2 - 4.5 - 5.0)
    failed = Ended("error", "default", "a", None, 1.0, 0.0, 0)
    assert r.ended(failed, cost) == pytest.approx(-15.0 - 30.0)
    assert cost == {"slo_violation": 2.0, "failed": 1.0, "ttft_excess_s": pytest.approx(0.2 + 29.9)}
    terms = r.episode(energy_j=600.0)
    # tenant a: 1 of 2 met, tenant b: 1 of 2 -> equal shares, Jain 1; 600 J over 500 + 100 good tokens
    assert terms == {"fairness": 1.0, "energy_per_good_token": pytest.approx(-1.0)}
    r.reset()
    r.ended(fast, zero_costs())
    r.ended(slow, zero_costs())
    # shares 1 and 0: Jain = 1 / 2
    assert r.episode(0.0)["fairness"] == pytest.approx(0.5)
    assert math.isfinite(r.episode_reward(0.0))
