"""``llmlb learn``: policies and predictors that are trained (docs/learning.md).

The group's commands train in the simulator (no GPU) and write plain-data files
(JSON, never pickle) that ``-p learned --policy-arg path=FILE`` and the predictive
policies load at inference. Training code lives in :mod:`llmlb_bench.learn` and is
imported inside each command, so ``llmlb --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from llmlb_bench.cli.app import app, console
from llmlb_bench.errors import UserError

learn_app = typer.Typer(help="Train routing policies and output-length predictors in the simulator, and run the "
                             "learning benchmark's standard tasks (docs/learning.md).", no_args_is_help=True)
app.add_typer(learn_app, name="learn")


@learn_app.command("predictor")
def predictor(
    trace: Annotated[Path, typer.Argument(help="Trace to fit on (Parquet, from llmlb gen or llmlb trace import).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Predictor file to write (JSON).")],
    objective: Annotated[str, typer.Option("--objective", help="regression (log output tokens) or rank "
                                                               "(LambdaRank within arrival windows).")] = "regression",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the held-out split and of LightGBM.")] = 0,
    trees: Annotated[int, typer.Option("--trees", help="Boosting rounds (trees).")] = 100,
    leaves: Annotated[int, typer.Option("--leaves", help="Leaves per tree.")] = 15,
    window: Annotated[int, typer.Option("--window", help="Requests per ranking window (rank objective; also the "
                                                         "window of the reported window tau).")] = 32,
    heldout: Annotated[float, typer.Option("--heldout", help="Share of conversations (or requests) held out "
                                                             "of fitting to measure the predictor.")] = 0.2,
) -> None:
    """Fit an output-length predictor on what is known when a request arrives (LightGBM; the
    `learn` extra) and report Kendall tau and MAE on held-out rows. Use the file with
    `--policy-arg predictor=FILE` on least_predicted_work / predicted_sjf or `--scheduler-arg predictor=FILE`
    on the engine's sjf scheduler."""
    from llmlb_bench.learn.predictor import fit
    from llmlb_bench.schema import read_trace
    from llmlb_bench.store.run import file_sha256, write_text_atomic

    if output.exists() and output.is_dir():
        raise UserError("is a directory", "--output")
    table = read_trace(trace)
    doc = fit(table, objective=objective, seed=seed, trees=trees, leaves=leaves, window=window, heldout=heldout,
              trace=trace, sha256=file_sha256(trace))
    write_text_atomic(output, json.dumps(doc, separators=(",", ":")) + "\n")
    h = doc["heldout"]
    t = Table("held-out rows", "Kendall tau", f"window tau ({h['window']})", "MAE (tokens)",
              "MAE of the median", title=f"{objective} predictor over {', '.join(f['name'] for f in doc['features'])}")
    t.add_row(str(h["rows"]), _fmt(h["kendall_tau"]), _fmt(h["window_tau"]), _fmt(h["mae_tokens"]),
              _fmt(h.get("median_mae_tokens")))
    console.print(t)
    console.print(f"wrote {output}")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"
