"""The routing environment trains under Ray RLlib (PPO, torch on CPU, RLlib's new API stack): a few
iterations on a tiny generated trace. Ray RLlib and torch are in the `test` extra, so CI runs it."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("torch")
pytest.importorskip("ray.rllib")


def _make(cfg):
    from gymnasium.wrappers import FlattenObservation

    from llmlb_bench.learn.env import RouteEnv

    return FlattenObservation(RouteEnv(**cfg))


@pytest.mark.slow
def test_ppo_trains_on_the_routing_env():
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.tune.registry import register_env

    from llmlb_bench.raycluster import ray_session

    requests = 50
    with ray_session(None, 1):
        register_env("llmlb-route-test", _make)
        config = (PPOConfig()
                  .environment("llmlb-route-test", env_config={"workload": "chat", "requests": requests,
                                                               "rate_scale": 3.0, "reward": "neg_latency",
                                                               "slo": None})
                  .env_runners(num_env_runners=0, rollout_fragment_length=100)
                  .training(train_batch_size=200, minibatch_size=50, num_epochs=2, lr=1e-3)
                  .framework("torch"))
        algo = config.build_algo()
        try:
            returns = []
            for _ in range(3):
                result = algo.train()
                runners = result["env_runners"]
                returns.append(runners["episode_return_mean"])
            assert runners["num_env_steps_sampled_lifetime"] == 600
            # neg_latency: every one of an episode's 50 requests ends ok and costs its latency, so an
            # episode's return is negative and above 50 x the failure latency (60 s)
            assert all(math.isfinite(r) and -requests * 60.0 < r < 0 for r in returns)
        finally:
            algo.stop()
