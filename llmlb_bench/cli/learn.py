"""``llmlb learn``: policies and predictors that are trained (docs/learning.md).

The group's commands train in the simulator (no GPU) and write plain-data files
(JSON, never pickle) that ``-p learned --policy-arg path=FILE`` and the predictive
policies load at inference. Training code lives in :mod:`llmlb_bench.learn` and is
imported inside each command, so ``llmlb --help`` stays fast.
"""

from __future__ import annotations

import typer

from llmlb_bench.cli.app import app

learn_app = typer.Typer(help="Train routing policies and output-length predictors in the simulator, and run the "
                             "learning benchmark's standard tasks (docs/learning.md).", no_args_is_help=True)
app.add_typer(learn_app, name="learn")
