"""Predicted-length shortest-job-first (e.g. Fu et al., "Efficient LLM Scheduling by Learning to
Rank", NeurIPS 2024; Qiu et al., "Efficient Interactive LLM Serving with Proxy Model-based
Sequence Length Prediction", 2024): ordering the queue by predicted output length lowers mean
latency in proportion to how well the predictor ranks requests (its Kendall tau); a predictor
that ranks at random is no better than FCFS.

Besides the oracles of chosen tau, a trained predictor: LightGBM fitted (``llmlb learn
predictor``) on a training trace of another seed from the same generator, which knows only
each request's task, its one feature known at arrival that tells something about its length
(as a mixed workload's datasets do). Fitting needs the ``learn`` extra."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmlb_bench.repro import traces
from llmlb_bench.metrics.run_figures import RunFigures
from llmlb_bench.repro.base import UNDEFINED_TAU, Arm, E2E_COLUMNS, Reproduction, Verdict, known, ratio, tau_text
from llmlb_bench.sim import ClusterConfig

REQUESTS = {"small": 500, "full": 800}
TAUS = {"small": (0.0, 0.9), "full": (0.0, 0.3, 0.6, 0.9, 1.0)}
TRAIN_REQUESTS = 4000
TASKS = ("task-a", "task-b", "task-c", "task-d")
#: correlation of a request's task score with its length's normal score (the task is that score in quartiles)
TASK_RHO = 0.8


def workload(n: int, seed: int) -> pa.Table:
    """One replica's traffic: 6 req/s Poisson, 200-token prompts, lognormal outputs, and a task
    label: the quartile of a score correlated (rho 0.8) with the output's normal score, from a
    generator of its own, so arrivals and lengths are those of the trace without tasks."""
    rng = np.random.default_rng(seed)
    arrival = traces.poisson(rng, 6.0, n)
    out = traces.lognormal(rng, 100, 1.0, n, 2000)
    from scipy.special import ndtri

    z = ndtri((np.argsort(np.argsort(out, kind="stable"), kind="stable") + 0.5) / n)
    task_rng = np.random.default_rng(seed + 1000)
    score = TASK_RHO * z + np.sqrt(1 - TASK_RHO**2) * task_rng.standard_normal(n)
    task = np.asarray(TASKS)[np.digitize(score, [-0.6745, 0.0, 0.6745])]
    return traces.table(arrival, 200, out, kind=pa.array(task).dictionary_encode())


def trained_predictor(scale: str, objective: str) -> tuple[str, float | None]:
    """Fit a predictor on a training trace (seed 2, never the evaluated one) and write it to a
    scratch file for this process; its path and Kendall tau on the evaluated trace (seed 1), None
    where it is undefined (one prediction for every request)."""
    from llmlb_bench.learn.predictor import evaluate_trace, fit
    from llmlb_bench.policies.predictor import Predictor

    doc = fit(workload(TRAIN_REQUESTS, 2), objective=objective, trees=50, trace="sjf-train-seed2")
    folder = Path(tempfile.mkdtemp(prefix="llmlb-repro-sjf-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / f"{objective}.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    tau = evaluate_trace(Predictor(doc, path), workload(REQUESTS[scale], 1))["kendall_tau"]
    return str(path), tau


def arms(scale: str) -> list[Arm]:
    # one replica with 8 seats offered 6 req/s of heavy-tailed outputs: a queue builds up to reorder
    t = workload(REQUESTS[scale], 1)
    out = [Arm("fcfs", t, ClusterConfig.build(replicas=1, max_num_seqs=8))]
    out += [Arm(f"sjf tau={tau:g}", t, ClusterConfig.build(replicas=1, max_num_seqs=8, scheduler="sjf",
                                                      scheduler_args={"tau": tau})) for tau in TAUS[scale]]
    for objective in ("regression", "rank"):
        path, tau = trained_predictor(scale, objective)
        out.append(Arm(f"sjf trained {objective} tau={tau_text(tau)}", t, ClusterConfig.build(
            replicas=1, max_num_seqs=8, scheduler="sjf", scheduler_args={"predictor": path})))
    return out


def _e2e(r: RunFigures) -> float:
    return known(r["e2e"]["mean"], "mean E2E")


def _trained(s: dict[str, RunFigures], objective: str) -> tuple[float | None, float]:
    """(held-out tau, None where undefined; mean E2E) of the trained predictor's arm."""
    label = next(k for k in s if k.startswith(f"sjf trained {objective}"))
    tau = label.split("=")[1]
    return None if tau == UNDEFINED_TAU else float(tau), _e2e(s[label])


def check(s: dict[str, RunFigures]) -> Verdict:
    fcfs = _e2e(s["fcfs"])
    taus = sorted(float(k.split("=")[1]) for k in s if k.startswith("sjf tau="))
    e2e = [_e2e(s[f"sjf tau={t:g}"]) for t in taus]
    noise, good = ratio(e2e[0], fcfs), ratio(_e2e(s["sjf tau=0.9"]), fcfs)
    monotone = all(b <= 1.05 * a for a, b in zip(e2e, e2e[1:]))
    trained = {obj: _trained(s, obj) for obj in ("rank", "regression")}
    gains = all(ratio(v, fcfs) < 0.85 for _, v in trained.values())
    ok = abs(noise - 1) < 0.1 and good < 0.6 and monotone and gains
    words = ", ".join(f"tau {t:g}: {v:.1f} s" for t, v in zip(taus, e2e))
    # the oracle tau with the same mean E2E (the oracle curve falls with tau: interpolate it reversed)
    like = {obj: float(np.interp(-v, [-x for x in e2e], taus)) for obj, (_, v) in trained.items()}
    taught = "; ".join(f"{obj} {v:.1f} s (held-out tau {tau_text(t)}, the E2E of an oracle of tau {like[obj]:.2f})"
                       for obj, (t, v) in trained.items())
    return Verdict(ok, f"mean E2E FCFS {fcfs:.1f} s; SJF {words}; trained on another seed: {taught} (claim: tau 0 "
                       "within 10% of FCFS, tau 0.9 below 0.6x FCFS, never rising by more than 5% as tau grows; "
                       "trained predictors below 0.85x FCFS)")


REPRO = Reproduction(
    name="sjf-predictor-quality",
    title="Predicted-length SJF: latency gain vs predictor quality (Kendall tau)",
    source="Fu et al., Efficient LLM Scheduling by Learning to Rank, NeurIPS 2024, Figure 1 and Table 2 "
           "(latency vs Kendall tau of the ranking predictor)",
    claim="Shortest-predicted-job-first lowers mean latency, and the gain grows with the predictor's Kendall "
          "tau against the true output length; at tau 0 it is FCFS. A predictor trained on what is known at "
          "arrival gains too.",
    setup="One A100-80G replica of Llama-3-8B with 8 batch seats, offered 6 req/s Poisson; prompts 200 tokens, "
          "outputs lognormal (median 100, sigma 1, at most 2,000); each request names one of four tasks, the "
          "quartile of a score correlated 0.8 with its output length's normal score. Engine scheduler FCFS vs "
          "`sjf` with an oracle predictor of Kendall tau 0-1 (aging 10 predicted tokens per second of waiting), "
          "and `sjf` with trained predictors (`llmlb learn predictor`, LightGBM, 50 trees, `--objective "
          "regression` and `rank`) fitted on 4,000 requests of another seed, whose only informative feature is "
          "the task; each one's Kendall tau on the evaluated trace is in its label. Both order requests by task "
          "(four distinct predictions, ties served in arrival order), so they gain less than an oracle of the "
          "same tau, whose predictions order every pair and spread over the whole length distribution against "
          "the aging term.",
    arms=arms,
    columns=E2E_COLUMNS,
    check=check,
    figure="e2e.mean",
)
