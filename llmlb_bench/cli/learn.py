"""``llmlb learn``: policies and predictors that are trained (docs/learning.md).

The group's commands train in the simulator (no GPU) and write plain-data files
(JSON, never pickle) that ``-p learned --policy-arg path=FILE`` and the predictive
policies load at inference. Training code lives in :mod:`llmlb_bench.learn` and is
imported inside each command, so ``llmlb --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llmlb_bench.cli.lazy import Group
from llmlb_bench.cli.app import app, console, err_console
from llmlb_bench.cli.common import ClusterFlags, SloOpt, cluster_flags
from llmlb_bench.console import Table
from llmlb_bench.errors import UserError
from llmlb_bench.progress import working

if TYPE_CHECKING:
    from llmlb_bench.learn.train import Generation

learn_app = typer.Typer(help="Train routing policies and output-length predictors in the simulator, and run the "
                             "learning benchmark's standard tasks (docs/learning.md).\n\n"
                             "Example:  llmlb learn bench tasks/learning.toml -o reports/learning",
                        no_args_is_help=True, cls=Group)
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
    on the engine's sjf scheduler.

    Example:

        llmlb learn predictor traces/chat-500.parquet -o chat-lengths.json --objective rank
    """
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


@learn_app.command("train")
@cluster_flags()
def train(
    source: Annotated[Path, typer.Argument(help="Workload spec (TOML: training traces are generated from it) "
                                                 "or a trace (Parquet: trained on as is).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Policy file to write (JSON).")],
    objective: Annotated[str, typer.Option("--objective", help="What to maximise, in the environment's reward "
                                                               "terms: slo_met, good_tokens, neg_latency, neg_ttft, "
                                                               "fairness, energy_per_good_token, or a weighted sum "
                                                               "such as good_tokens=1,fairness=0.5.")] = "slo_met",
    slo: SloOpt = "ttft=500ms,tpot=50ms",
    cluster: ClusterFlags = ClusterFlags(),
    seed: Annotated[int, typer.Option("--seed", min=0, help="Training seed: candidates, training traces "
                                                            "(seeds 1000000 + 1000 x seed + k) and simulations.")] = 0,
    traces: Annotated[int, typer.Option("--traces", min=1, help="Training traces generated from a spec.")] = 2,
    requests: Annotated[Optional[int], typer.Option("--requests", min=1, help="Requests per generated training "
                                                                               "trace (default: the spec's).")] = None,
    hidden: Annotated[Optional[list[int]], typer.Option("--hidden", help="Hidden tanh layer width (repeatable; "
                                                                         "none: a linear scorer).")] = None,
    fields: Annotated[Optional[str], typer.Option("--fields", help="Comma-separated features (default: all; "
                                                                   "see docs/learning.md).")] = None,
    generations: Annotated[int, typer.Option("--generations", min=1, help="Cross-entropy method generations.")] = 8,
    population: Annotated[int, typer.Option("--population", min=2, help="Candidates per generation.")] = 12,
    elite: Annotated[int, typer.Option("--elite", min=1, help="Best candidates the next generation is fitted to.")] = 3,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Processes evaluating candidates in parallel.")] = 1,
    predictor: Annotated[Optional[Path], typer.Option("--predictor", help="Length predictor file (llmlb learn "
                                                                          "predictor) for the predicted_output "
                                                                          "feature; run the policy with "
                                                                          "--policy-arg predictor=FILE too.")] = None,
) -> None:
    """Train a routing policy (linear or small MLP over per-target features) by whole simulated runs, no GPU.

    The cross-entropy method scores each candidate by simulating the training traces under it
    (the simulator of llmlb simulate) and keeps the best; the file then runs anywhere with
    -p learned --policy-arg path=FILE. Training traces use seeds of 1000000 and up, so evaluation
    seeds (below) never overlap them.

    Example:

        llmlb learn train workloads/chat.toml --replicas 4 --requests 800 --objective slo_met --slo ttft=300ms -o chat.json

        llmlb simulate trace.parquet --replicas 4 -p learned --policy-arg path=chat.json
    """
    from llmlb_bench.learn.rewards import Reward
    from llmlb_bench.learn.train import check_search, generated_trace, trace_identity, train_policy, train_seeds, write_policy
    from llmlb_bench.metrics.slo import Slo
    from llmlb_bench.policies.features import Features
    from llmlb_bench.schema import read_trace, trace_spec
    from llmlb_bench.workload import load_spec

    parsed = Slo.parse(slo)
    Reward.parse(objective, parsed, where="--objective")
    check_search(population, elite)
    if hidden and min(hidden) < 1:
        raise UserError("hidden layer widths must be >= 1", "--hidden")
    length = None
    if predictor is not None:
        from llmlb_bench.policies.predictor import load_predictor
        length = load_predictor(predictor)
    if fields:
        Features(fields=fields.split(","), predictor=length, where="--fields")
    if not output.parent.is_dir():
        raise UserError("its folder does not exist", str(output))
    config = cluster.config()
    if source.suffix == ".toml":
        spec = load_spec(source)
        seeds = train_seeds(seed, traces)
        with working(err_console, f"generating {traces} training trace(s) from {source.name}"):
            tables = [generated_trace(spec, s, requests) for s in seeds]
        identity = trace_identity(source, spec.replace(**({"requests": requests} if requests else {})).to_dict(),
                                  seeds, tables)
    else:
        tables = [read_trace(source)]
        identity = trace_identity(source, trace_spec(tables[0]), [], tables)

    def report(g: "Generation") -> None:
        err_console.print(f"generation {g.index + 1}/{generations}: best {g.best:.4f}  mean {g.mean:.4f}  "
                          f"best so far {g.best_ever:.4f}  spread {g.spread:.3f}", highlight=False, soft_wrap=True)

    rows = sum(t.num_rows for t in tables)
    err_console.print(f"training on {len(tables)} trace(s), {rows:,} requests: {generations} x {population} "
                      f"simulations each", highlight=False, soft_wrap=True)
    doc, result = train_policy(tables, config, objective=objective, slo=parsed, identity=identity, seed=seed,
                               hidden=tuple(hidden or ()), fields=fields.split(",") if fields else None,
                               generations=generations, population=population, elite=elite, workers=workers,
                               progress=report, predictor=str(predictor or ""))
    write_policy(doc, output)
    console.print(f"{output}: {objective} {result.fitness:.4f} on the training traces "
                  f"({result.evaluations} simulations)", highlight=False, soft_wrap=True)


@learn_app.command("bench")
def bench(
    tasks_file: Annotated[Path, typer.Argument(help="Tasks file (TOML).")] = Path("tasks/learning.toml"),
    task: Annotated[Optional[list[str]], typer.Option("--task", "-t", help="Run only this task (repeatable).")] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="Evaluation seeds, comma-separated (below 1000000: "
                                                       "never a training seed).")] = "1,2,3,4,5",
    train_seed: Annotated[int, typer.Option("--train-seed", min=0, help="Training seed of every task's policy.")] = 0,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the report (README.md, results.json) "
                                                          "and each task's policy file.")] = Path("reports/learning"),
    results: Annotated[Path, typer.Option("--results", "-r", help="Results folder for the evaluation runs "
                                                                  "(one sub-folder per task).")] = Path("results/learning"),
    workers: Annotated[int, typer.Option("--workers", min=1, help="Processes evaluating training candidates.")] = 1,
) -> None:
    """Rerun the learning benchmark: per task, train a policy, then simulate every listed heuristic, the
    bandit and the trained policy on each evaluation seed and compare them with the gate's paired statistics.

    Example:

        llmlb learn bench tasks/learning.toml --seeds 1,2,3,4,5 -o reports/learning

        llmlb learn bench --task stale-signals --seeds 1,2,3
    """
    import json
    import shlex
    import sys

    from llmlb_bench.learn.bench import load_tasks, markdown, run_task
    from llmlb_bench.learn.train import check_eval_seeds

    try:
        eval_seeds = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"expected comma-separated integers, got {seeds!r}", "--seeds") from None
    if len(eval_seeds) < 2 or len(set(eval_seeds)) != len(eval_seeds) or min(eval_seeds) < 0:
        raise UserError("give two or more distinct seeds >= 0 (intervals need repeats)", "--seeds")
    check_eval_seeds(eval_seeds, "--seeds")
    chosen = load_tasks(tasks_file, task or ())
    out.mkdir(parents=True, exist_ok=True)
    say = lambda line: err_console.print(line, highlight=False, soft_wrap=True)  # noqa: E731
    records = [run_task(t, out, results, eval_seeds, train_seed, workers, say) for t in chosen]
    command = "llmlb learn bench " + " ".join(shlex.quote(a) for a in sys.argv[2:] if a != "bench")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    doc = {"command": command, "loadavg": load, "tasks": records}
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    header = (f"# Learning benchmark\n\nMade by `{command}` (load average {' '.join(load)} at the end). Runs are "
              f"simulations; figures are deterministic given the seeds.")
    (out / "README.md").write_text(markdown(records, header) + "\n", encoding="utf-8")
    console.print(f"{out / 'README.md'}: {len(records)} task(s)", highlight=False, soft_wrap=True)
