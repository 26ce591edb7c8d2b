"""Learning over the simulator: environments, trainers and the ``llmlb learn`` commands' logic.

This package sits above :mod:`llmlb_bench.sim` (it drives the simulator); nothing below imports
it. What runs at inference (trained policies, predictors) lives in :mod:`llmlb_bench.policies`.

The gymnasium routing environment is ``env.py`` (its rewards ``rewards.py``, spaces ``spaces.py``,
episodes ``episodes.py``; docs/learning.md). Importing this package loads no training library.
The environments' ids (:data:`ENV_ID`, :data:`ADMISSION_ID`) are registered with gymnasium by importing
``llmlb_bench.learn.env``, by :func:`register`, and by importing this package once gymnasium is
loaded, which is what ``gymnasium.make("llmlb_bench.learn:llmlb/Route-v0")`` does (gymnasium 1.x
has no plugin entry points; its ``module:id`` form imports the module first).
"""

from __future__ import annotations

import sys

#: the routing environment's gymnasium id (one step per routing decision)
ENV_ID = "llmlb/Route-v0"
#: the coarse environment's id (one step per interval: the admission limit; ``admission.py``)
ADMISSION_ID = "llmlb/Admission-v0"


def register() -> None:
    """Register :data:`ENV_ID` and :data:`ADMISSION_ID` with gymnasium (idempotent)."""
    import gymnasium

    for env_id, entry in ((ENV_ID, "llmlb_bench.learn.env:RouteEnv"),
                          (ADMISSION_ID, "llmlb_bench.learn.admission:AdmissionEnv")):
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry)


if "gymnasium" in sys.modules:
    register()
