"""Generalisation of trained output-length predictors: from generated traffic to a real trace.

The real trace is Azure's 2023 production hour (Splitwise, ISCA'24): its code and
conversation traces imported and merged, tenants ``code`` and ``chat`` (kinds alike), so a
request's tenant, kind and prompt length are what is known at arrival. Every predictor is
evaluated on the same rows, the trace's first ``--eval-s`` seconds; none saw them:

* ``real``: fitted on the rest of the real hour (the in-domain ceiling);
* ``fitted``: fitted on traffic generated from a spec ``llmlb trace fit`` made of the rest of
  the hour (per tenant: arrivals, length distributions, input/output copula);
* ``preset``: fitted on traffic generated from ``workloads/multi-tenant.toml`` (tenants chat,
  batch and code; its code tenant modelled on the same Azure code lengths).

For each, regression and rank objectives: Kendall tau (overall and within windows of 32
arrivals), MAE, and the gap to ``real``. Then the evaluation rows are simulated on
``--replicas`` replicas under the engine's ``sjf`` scheduler with each predictor, beside FCFS
and oracles, with the SLO below: goodput and mean E2E say what the gap costs. Last, a routing
policy (``learned``, trained by ``llmlb learn train``'s cross-entropy method with the fitted
predictor's ``predicted_output``) trained on the real rest of the hour and on the fitted traffic,
against the classic routers on the evaluation rows.

    python benchmarks/predictor_generalisation.py --data ../shared/data --out reports/learning/predictor-generalisation

The data folder is read, never copied. Prints the load average beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from llmlb_bench.learn.predictor import evaluate_trace, fit
from llmlb_bench.learn.train import train_policy, write_policy
from llmlb_bench.metrics.slo import Slo
from llmlb_bench.policies.predictor import Predictor
from llmlb_bench.repro.base import Arm, Reproduction, Verdict
from llmlb_bench.repro.runner import _simulate
from llmlb_bench.schema import TRACE
from llmlb_bench.sim import ClusterConfig
from llmlb_bench.workload import generate, load_spec
from llmlb_bench.workload.fit import fit_trace
from llmlb_bench.workload.importers import import_trace
from llmlb_bench.workload.spec import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
SLO = "ttft=2s,tpot=100ms"


def real_trace(data: Path) -> pa.Table:
    """Azure 2023 code + conversation, one table in arrival order with fresh request ids."""
    folder = data / "traces" / "azure-llm-2023"
    parts = [import_trace("azure-2023", folder / f"AzureLLMInferenceTrace_{name}.csv", kind=tenant,
                          tenant=tenant).table for name, tenant in (("code", "code"), ("conv", "chat"))]
    t0 = min(pc.min(p.column("arrival_s")).as_py() for p in parts)
    merged = pa.concat_tables([p.cast(parts[0].schema) for p in parts])
    merged = merged.set_column(merged.schema.get_field_index("arrival_s"), "arrival_s",
                               pc.subtract(merged.column("arrival_s"), t0))
    merged = merged.take(pc.sort_indices(merged, [("arrival_s", "ascending")]))
    ids = pa.array(np.arange(merged.num_rows, dtype=np.int64))
    return TRACE.conform(merged.set_column(0, "request_id", ids), "azure-2023")


def generated(spec: dict[str, Any] | Path, requests: int, seed: int) -> pa.Table:
    ws = load_spec(spec) if isinstance(spec, Path) else WorkloadSpec.from_dict(spec, "fitted spec")
    return generate(ws.replace(requests=requests), seed=seed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "learning" / "predictor-generalisation")
    ap.add_argument("--eval-s", type=float, default=900.0, help="evaluation rows: the first seconds of the hour")
    ap.add_argument("--requests", type=int, default=20000, help="generated training requests")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--policy-requests", type=int, default=2000, help="training requests of a routing policy")
    ap.add_argument("--generations", type=int, default=4, help="cross-entropy generations of a routing policy")
    args = ap.parse_args()

    real = real_trace(args.data)
    arrival = real.column("arrival_s").to_numpy()
    evaluation = real.filter(pa.array(arrival < args.eval_s))
    rest = real.filter(pa.array(arrival >= args.eval_s))
    sources = {
        "real": rest,
        "fitted": generated(fit_trace(rest, name="azure-fitted").spec, args.requests, 1),
        "preset": generated(ROOT / "workloads" / "multi-tenant.toml", args.requests, 1),
    }
    scratch = Path(tempfile.mkdtemp(prefix="llmlb-generalise-"))
    rows, files = [], {}
    for source, table in sources.items():
        for objective in ("regression", "rank"):
            doc = fit(table, objective=objective, trees=args.trees, trace=f"{source}.parquet")
            path = scratch / f"{source}-{objective}.json"
            path.write_text(json.dumps(doc), encoding="utf-8")
            files[(source, objective)] = str(path)
            on_real = evaluate_trace(Predictor(doc, path), evaluation)
            rows.append({"source": source, "objective": objective, "train_rows": table.num_rows,
                         "features": [f["name"] for f in doc["features"]],
                         "own_heldout": doc["heldout"], "on_real": on_real})
            print(source, objective, doc["heldout"]["kendall_tau"], on_real, flush=True)

    def cluster(**sched: Any) -> ClusterConfig:
        return ClusterConfig.build(replicas=args.replicas, **sched)

    arms = [Arm("fcfs", evaluation, cluster()), Arm("oracle tau=1", evaluation, cluster(
        scheduler="sjf", scheduler_args={"tau": 1.0}))]
    arms += [Arm(p, evaluation, cluster(), p) for p in ("round_robin", "least_outstanding", "least_tokens")]
    learned = {}
    for source in ("real", "fitted"):
        # a routing policy trained (llmlb learn train's cross-entropy method, MLP over every feature and
        # the fitted-traffic predictor's predicted_output) on the first rows of each training source
        train = sources[source].slice(0, args.policy_requests)
        doc, res = train_policy([train], cluster(), objective="slo_met", slo=Slo.parse(SLO, "slo"),
                                identity={"source": source, "rows": train.num_rows}, seed=0, hidden=(8,),
                                generations=args.generations, population=8, elite=2,
                                predictor=files[("fitted", "regression")])
        path = scratch / f"policy-{source}.json"
        write_policy(doc, path)
        learned[source] = {"train_rows": train.num_rows, "train_fitness": res.fitness}
        arms.append(Arm(f"learned trained on {source}", evaluation, cluster(), "learned",
                        {"path": str(path), "predictor": files[("fitted", "regression")]}))
        print("trained", source, res.fitness, flush=True)
    best = max(r["on_real"]["kendall_tau"] or 0 for r in rows)
    arms.append(Arm(f"oracle tau={best:.2f}", evaluation,
                    cluster(scheduler="sjf", scheduler_args={"tau": round(best, 2)})))
    arms += [Arm(f"sjf {s} {o}", evaluation, cluster(scheduler="sjf", scheduler_args={"predictor": f}))
             for (s, o), f in files.items()]
    study = Reproduction("predictor-generalisation", "", "", "", "", lambda scale: arms, (),
                         lambda s: Verdict(True, ""), "", slo=SLO)
    summaries = _simulate(study, arms, 0)
    runs = {label: {**{k: (s.get("slo") or {}).get(k) for k in ("goodput", "attainment")},
                    "e2e_mean": s["e2e"]["mean"], "ttft_p99": s["ttft"]["p99"], "requests": s["requests"]}
            for label, s in summaries.items()}
    load = os.getloadavg()
    result = {"eval_s": args.eval_s, "eval_rows": evaluation.num_rows, "slo": SLO, "replicas": args.replicas,
              "predictors": rows, "policies": learned, "runs": runs, "loadavg": [round(x, 2) for x in load]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (args.out / "README.md").write_text(render(result), encoding="utf-8")
    print(json.dumps(runs, indent=1))
    print("load average", load)


def _f(v: Any, fmt: str = "{:.3f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(r: dict[str, Any]) -> str:
    """The report: predictor figures on the real rows and their gap to the in-domain predictor,
    then the simulated runs."""
    real = {p["objective"]: p["on_real"] for p in r["predictors"] if p["source"] == "real"}
    lines = [
        "# Trained predictors and policies: from generated traffic to a real trace",
        "",
        "Made by `python benchmarks/predictor_generalisation.py` (its docstring says what each row is). "
        f"Evaluation rows: the first {r['eval_s']:.0f} s of Azure's 2023 code + conversation hour "
        f"({r['eval_rows']:,} requests), never seen by any predictor or policy. "
        f"Load average while it ran: {', '.join(str(x) for x in r['loadavg'])}.",
        "",
        "## Output-length predictors on the real rows",
        "",
        "| trained on | objective | rows | features | tau (own held-out) | tau on real | window tau on real "
        "| MAE on real (tokens) | tau gap to real-trained |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in r["predictors"]:
        o = p["on_real"]
        gap = None if o["kendall_tau"] is None else real[p["objective"]]["kendall_tau"] - o["kendall_tau"]
        lines.append(f"| {p['source']} | {p['objective']} | {p['train_rows']:,} | {', '.join(p['features'])} | "
                     f"{_f(p['own_heldout']['kendall_tau'])} | {_f(o['kendall_tau'])} | {_f(o['window_tau'])} | "
                     f"{_f(o['mae_tokens'], '{:.1f}')} | {_f(gap)} |")
    lines += [
        "",
        f"## Simulated: {r['replicas']} replicas (Llama-3-8B, A100-80G), SLO {r['slo']}",
        "",
        "`fcfs` is round robin with the engine's FCFS queue; `sjf ...` rows are the engine's `sjf` scheduler "
        "(aging 10) with that predictor (round robin routing); `learned trained on ...` rows route with a "
        "policy trained by `llmlb learn train`'s cross-entropy method (MLP, 8 units, objective slo_met, "
        "the fitted predictor's predicted_output among its features) on 2,000 rows of that source.",
        "",
        "| run | goodput (req/s) | attainment | E2E mean (s) | TTFT p99 (s) |",
        "|---|---|---|---|---|",
    ]
    for label, v in r["runs"].items():
        lines.append(f"| {label} | {_f(v['goodput'])} | {_f(v['attainment'])} | {_f(v['e2e_mean'], '{:.2f}')} | "
                     f"{_f(v['ttft_p99'], '{:.1f}')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
