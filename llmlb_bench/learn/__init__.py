"""Learning over the simulator: environments, trainers and the ``llmlb learn`` commands' logic.

This package sits above :mod:`llmlb_bench.sim` (it drives the simulator); nothing below imports
it. What runs at inference (trained policies, predictors) lives in :mod:`llmlb_bench.policies`.

The gymnasium routing environment is ``env.py`` (its rewards ``rewards.py``, spaces ``spaces.py``,
episodes ``episodes.py``; docs/learning.md). Importing this package loads no training library.
The environment's id :data:`ENV_ID` is registered with gymnasium by importing
``llmlb_bench.learn.env``, by :func:`register`, and by importing this package once gymnasium is
loaded, which is what ``gymnasium.make("llmlb_bench.learn:llmlb/Route-v0")`` does (gymnasium 1.x
has no plugin entry points; its ``module:id`` form imports the module first).
"""

from __future__ import annotations

import sys

#: the environment's gymnasium id
ENV_ID = "llmlb/Route-v0"


def register() -> None:
    """Register :data:`ENV_ID` with gymnasium (idempotent)."""
    import gymnasium

    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point="llmlb_bench.learn.env:RouteEnv")


if "gymnasium" in sys.modules:
    register()
