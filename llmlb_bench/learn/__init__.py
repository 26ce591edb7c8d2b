"""Learning over the simulator: environments, trainers and the ``llmlb learn`` commands' logic.

This package sits above :mod:`llmlb_bench.sim` (it drives the simulator); nothing below imports
it. What runs at inference (trained policies, predictors) lives in :mod:`llmlb_bench.policies`.
"""
