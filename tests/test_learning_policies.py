"""The learning family: the LinUCB bandit (against its regret bound and in the simulator) and the
trained-policy file (forward pass, every load check as one line)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from llmlb_bench.errors import UserError
from llmlb_bench.learn.train import simulate_outcome
from llmlb_bench.policies import make_policy
from llmlb_bench.policies.bandit import LinUcb
from llmlb_bench.policies.base import Outcome, RouteRequest, TargetInfo, View
from llmlb_bench.policies.features import Features
from llmlb_bench.policies.learned import LearnedPolicy, n_params, unflatten
from llmlb_bench.schema import read_trace, write_trace
from llmlb_bench.sim import load_cluster
from llmlb_bench.workload import generate, load_spec
from llmlb_bench.policies.base import fill, set_now
from sim_helpers import learned_policy_file

ROOT = Path(__file__).resolve().parents[1]


def _pull_arms(pol: LinUcb, latencies: list[float], rounds: int) -> np.ndarray:
    """A K-armed bandit with deterministic latencies and immediate feedback; returns pulls per arm."""
    view = View([TargetInfo(f"t{i}") for i in range(len(latencies))])
    pulls = np.zeros(len(latencies), dtype=int)
    for k in range(rounds):
        set_now(view, float(k))
        fill(view, "signal_time", [view.now] * len(latencies))  # signal age 0: the one feature is constant 0
        req = RouteRequest(k, arrival_s=view.now, input_tokens=10, max_output_tokens=10)
        t = pol.choose(req, view)
        pulls[t] += 1
        req.outcome = Outcome("ok", view.now + latencies[t], view.now + latencies[t], 10)
        pol.on_complete(req, t, view)
    return pulls


def test_linucb_pulls_each_worse_arm_no_more_than_its_bound():
    # With a feature that is always 0, LinUCB is per-target ridge UCB: after n pulls of arm k its
    # index is r_k - lambda r_k / N + alpha / sqrt(N), N = n + lambda. With alpha >= 1 (lambda = 1,
    # rewards in 0..1) the best arm's index never drops below r*, so a worse arm is pulled again only
    # while alpha / sqrt(N) >= Delta_k: at most alpha^2 / Delta_k^2 pulls in all, whatever the horizon.
    latencies = [0.1, 0.2, 0.3, 0.9]            # budget 1 s: rewards 0.9, 0.8, 0.7, 0.1
    alpha = 1.0
    pol = LinUcb(alpha=alpha, budget_s=1.0, fields="signal_age_s", seed=3)
    pulls = _pull_arms(pol, latencies, 3000)
    rewards = 1.0 - np.array(latencies)
    gaps = rewards.max() - rewards
    for k in range(1, 4):
        assert 1 <= pulls[k] <= math.floor(alpha ** 2 / gaps[k] ** 2 + 1e-9), (k, pulls)
    regret = float((pulls * gaps).sum())
    assert regret <= sum(alpha ** 2 / g for g in gaps[1:])
    assert pulls[0] >= 3000 - 100 - 25 - 1


def test_linucb_is_deterministic_by_seed_and_ties_follow_the_seed():
    a = _pull_arms(LinUcb(seed=5, fields="signal_age_s"), [0.2, 0.2, 0.2], 200)
    b = _pull_arms(LinUcb(seed=5, fields="signal_age_s"), [0.2, 0.2, 0.2], 200)
    assert a.tolist() == b.tolist()


def _slow_fleet(tmp_path: Path) -> Path:
    path = tmp_path / "slow.toml"
    path.write_text('model = "llama-3-8b"\n[[pools]]\nname = "fast"\nreplicas = 3\ngpu = "h100-sxm"\n'
                    '[[pools]]\nname = "slow"\nreplicas = 1\ngpu = "l4"\n')
    return path


def test_bandit_learns_to_avoid_a_much_slower_replica_in_the_simulator(tmp_path):
    # Three H100s and one L4 (several times slower) serving chat at a rate the L4 cannot take a
    # quarter of: round robin drowns it. The bandit sees only its own in-flight counts (no capacity
    # hint), so avoiding the L4 is learned from outcomes, through its per-target intercept.
    cfg = load_cluster(_slow_fleet(tmp_path))
    trace = generate(load_spec(ROOT / "workloads/chat.toml").replace(requests=1500, seed=11))
    path = tmp_path / "t.parquet"
    write_trace(trace, path, block_size=16)
    trace = read_trace(path)

    class Counting(LinUcb):
        def choose(self, req, view):
            t = super().choose(req, view)
            self.sent.append(t)
            return t

    bandit = Counting(fields="outstanding_requests", seed=0)
    bandit.sent = []
    learned = simulate_outcome(trace, cfg, bandit, 0)
    rr = simulate_outcome(trace, cfg, make_policy("round_robin"), 0)
    late = np.array(bandit.sent[len(bandit.sent) // 2:])
    assert bandit.updates == 1500
    assert (late == 3).mean() < 0.05                 # round robin: 0.25
    assert np.nanmean(learned.ttft) < 0.2 * np.nanmean(rr.ttft)
    assert bandit._theta[-1] < min(bandit._theta[-4:-1])   # the L4's intercept is the lowest


def _policy_file(tmp_path: Path, weights: dict[str, float], **changes) -> Path:
    path = learned_policy_file(tmp_path, weights)
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))
    return path


def test_learned_linear_file_routes_to_the_argmax_of_its_scores_over_healthy_targets(tmp_path):
    pol = make_policy("learned", {"path": str(_policy_file(tmp_path, {"outstanding_requests": -1.0}))})
    view = View([TargetInfo(f"t{i}") for i in range(4)], outstanding_requests=[5, 2, 1, 3],
                healthy=[True, True, False, True])
    req = RouteRequest(0, arrival_s=0.0, input_tokens=100, max_output_tokens=50)
    assert pol.choose(req, view) == 1                    # 2 is less loaded but unhealthy
    fill(view, "outstanding_requests", [0, 0, 0, 0])
    fill(view, "healthy", [True] * 4)
    assert sorted(pol.choose(req, view) for _ in range(4)) == [0, 1, 2, 3]   # ties rotate


def test_learned_mlp_scores_each_target_with_shared_weights(tmp_path):
    f = Features()
    n_in = len(f.target_names) + len(f.request_names)
    rng = np.random.default_rng(0)
    layers = unflatten(rng.standard_normal(n_params(n_in, [5])), n_in, [5])
    pol = LearnedPolicy.from_model(layers, f)
    view = View([TargetInfo(f"t{i}") for i in range(3)], outstanding_requests=[4, 1, 9], waiting=[2, 0, 7])
    req = RouteRequest(0, arrival_s=0.0, input_tokens=300, max_output_tokens=20)
    scores = pol.scores(req, view)
    x = np.hstack([f.targets(req, view), np.tile(f.request(req), (3, 1))]).astype(np.float64)
    (w1, b1), (w2, b2) = layers
    assert np.allclose(scores, (np.tanh(x @ w1.T + b1) @ w2.T + b2)[:, 0])


@pytest.mark.parametrize("change, fragment", [
    ({"format": "other"}, "not an llmlb policy file"),
    ({"version": 2}, "policy file version 2"),
    ({"model": {"kind": "linear", "layers": [{"weight": [[0.0] * 3], "bias": [0.0]}]}},
     "layer 0 weight has shape [1, 3]"),
    ({"model": {"kind": "forest", "layers": []}}, "model kind 'forest'"),
    # as many inputs as the default layout has fields, so the shape passes and the values are checked
    ({"model": {"kind": "linear", "layers": [{"weight": [[float("nan")] * (len(Features().target_names)
                                                                            + len(Features().request_names))],
                                              "bias": [0.0]}]}}, "not finite"),
])
def test_learned_bad_files_are_one_line_errors_before_work(tmp_path, change, fragment):
    path = _policy_file(tmp_path, {}, **change)
    with pytest.raises(UserError) as info:
        make_policy("learned", {"path": str(path)})
    assert fragment in info.value.line() and str(path) in info.value.line()


def test_learned_file_of_another_feature_layout_is_refused(tmp_path):
    path = _policy_file(tmp_path, {})
    doc = json.loads(path.read_text())
    doc["features"]["per_target"][0]["scale"] = 2.0
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match="feature layout differs"):
        make_policy("learned", {"path": str(path)})


def test_simulate_with_a_bad_policy_file_exits_2_with_one_line(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    trace = tmp_path / "t.parquet"
    write_trace(generate(load_spec(ROOT / "workloads/chat.toml").replace(requests=20)), trace)
    out = subprocess.run([sys.executable, "-m", "llmlb_bench", "simulate", str(trace), "-p", "learned",
                          "--policy-arg", f"path={path}", "--results", str(tmp_path / "r")],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"error: {path}: not a readable JSON policy file (JSONDecodeError)"]
    assert not (tmp_path / "r").exists()


def _llmlb(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmlb_bench", *args], capture_output=True, text=True, cwd=cwd)


def test_learn_train_writes_a_deterministic_plain_policy_file_that_simulate_runs(tmp_path):
    common = ["learn", "train", str(ROOT / "workloads/chat.toml"), "--replicas", "2", "--requests", "120",
              "--traces", "1", "--generations", "2", "--population", "4", "--elite", "2", "--slo", "ttft=200ms",
              "--seed", "4"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    first = _llmlb(*common, "-o", str(a))
    assert first.returncode == 0, first.stderr
    assert "generation 2/2" in first.stderr
    assert _llmlb(*common, "--workers", "2", "-o", str(b)).returncode == 0
    assert a.read_bytes() == b.read_bytes()            # same seed, any number of workers
    doc = json.loads(a.read_text())
    assert doc["format"] == "llmlb.policy" and doc["objective"]["name"] == "slo_met"
    trace = doc["training"]["trace"]
    assert trace["rows"] == 120 and trace["seeds"] == [1_004_000] and len(trace["sha256"]) == 64
    assert trace["spec"]["name"] == "chat" and doc["training"]["seed"] == 4
    # the best ever is the best of every generation (the search keeps it)
    assert doc["objective"]["train_fitness"] == max(g["best"] for g in doc["training"]["history"])
    gen = tmp_path / "t.parquet"
    write_trace(generate(load_spec(ROOT / "workloads/chat.toml").replace(requests=60)), gen)
    run = _llmlb("simulate", str(gen), "--replicas", "2", "-p", "learned", "--policy-arg", f"path={a}",
                 "--results", str(tmp_path / "r"), "-f", "json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["runs"][0]["ok"] == 60


@pytest.mark.parametrize("args, line", [
    (["--objective", "fast"], "error: --objective: unknown reward term 'fast'"),
    (["--fields", "waiting,bogus"], "error: --fields: unknown feature 'bogus'"),
    (["--elite", "5"], "error: --elite: elite must be between 1 and population - 1"),
])
def test_learn_train_bad_input_is_one_line_before_work(tmp_path, capsys, args, line):
    from llmlb_bench.cli import main

    with pytest.raises(SystemExit) as info:
        main(["learn", "train", str(ROOT / "workloads/chat.toml"), "--requests", "50", "--population", "4",
              "-o", str(tmp_path / "p.json"), *args])
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), lines
    assert not (tmp_path / "p.json").exists()


def test_training_and_evaluation_seeds_are_apart_by_construction():
    from llmlb_bench.learn.train import TRAIN_SEED_BASE, check_eval_seeds, train_seeds

    assert min(train_seeds(0, 3)) >= TRAIN_SEED_BASE
    check_eval_seeds([0, 1, 2, 3, 4], "--seeds")
    with pytest.raises(UserError, match="is a training seed"):
        check_eval_seeds([1, TRAIN_SEED_BASE + 2], "--seeds")


def test_llmlb_run_compares_a_policy_file_and_the_bandit_with_a_heuristic(tmp_path):
    spec = tmp_path / "chat.toml"
    spec.write_text((ROOT / "workloads/chat.toml").read_text().replace("requests = ", "requests = 60 #"))
    path = learned_policy_file(tmp_path)
    out = _llmlb("run", str(spec), "--replicas", "2", "-p", "round_robin", "-p", "learned", "-p", "bandit",
                 "--policy-arg", f"learned.path={path}", "--policy-arg", "bandit.alpha=0.5",
                 "--results", str(tmp_path / "r"), "-f", "json")
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)["runs"]
    assert sorted(r["policy"] for r in runs) == ["bandit", "learned", "round_robin"]
    assert all(r["ok"] == 60 for r in runs)
