"""What engine schedulers, stale signals and MoE expert load cost the simulator.

    python benchmarks/sched_speed.py                     # 200k requests of the multi-tenant preset, 8 replicas
    python benchmarks/sched_speed.py --requests 50000

Runs the multi-tenant preset (three tenants with priorities and SLO classes)
once per variant on the same trace, with compact token times, and prints CPU
seconds of the simulation (trace generation excluded), simulated requests per
CPU second and the number of events, next to FCFS with fresh signals. The MoE
variants serve Mixtral 8x7B on 4 H100s per replica instead, against their own
balanced baseline. Every variant's work should grow with events, not tokens:
the events column shows where a variant changes the batch dynamics (a
different admission order means different runs), the CPU column what each
event costs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("fcfs", {}),
    ("priority", {"scheduler": "priority"}),
    ("sjf tau=0.9", {"scheduler": "sjf", "scheduler_args": {"tau": 0.9}}),
    ("vtc", {"scheduler": "vtc"}),
    ("deadline", {"scheduler": "deadline", "scheduler_args": {"deadlines": "interactive=0.5,tight=0.2,batch=30"}}),
    ("fcfs, signals every 1 s", {"signal_refresh_s": 1.0}),
]
MOE = {"model": "mixtral-8x7b", "gpu": "h100-sxm", "tp": 4}
MOE_VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("mixtral balanced", MOE),
    ("mixtral zipf 1.2 + EPLB 10 s", {**MOE, "moe": {"zipf_s": 1.2, "eplb_interval_s": 10.0, "redundant_experts": 4}}),
]


def one(trace: Any, replicas: int, cluster: dict[str, Any]) -> dict[str, Any]:
    from llmlb_bench.policies import make_policy
    from llmlb_bench.sim import ClusterConfig, simulate
    from llmlb_bench.store import RunStore

    cfg = ClusterConfig.build(replicas=replicas, token_times="summary", **cluster)
    with tempfile.TemporaryDirectory() as results:
        cpu0 = time.process_time()
        with RunStore(results, config={"cluster": cfg.to_dict()}, backend="sim", label="speed") as run:
            summary = simulate(trace, cfg, make_policy("least_outstanding"), run)
        cpu = time.process_time() - cpu0
    return {"cpu_s": cpu, "events": summary["events"]}


def main() -> None:
    from llmlb_bench.workload import generate, load_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--replicas", type=int, default=8)
    args = ap.parse_args()
    spec = load_spec(REPO / "workloads" / "multi-tenant.toml").replace(requests=args.requests)
    trace = generate(spec, rate_scale=args.replicas / 4)
    print(f"{args.requests:,} multi-tenant requests on {args.replicas} replicas (least_outstanding routing)")
    print(f"{'variant':32s} {'cpu s':>8s} {'req/cpu s':>10s} {'events':>10s} {'cpu/event':>10s}")
    for name, cluster in VARIANTS + MOE_VARIANTS:
        r = one(trace, args.replicas, cluster)
        print(f"{name:32s} {r['cpu_s']:8.2f} {args.requests / r['cpu_s']:10,.0f} {r['events']:10,d} "
              f"{r['cpu_s'] / r['events'] * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
