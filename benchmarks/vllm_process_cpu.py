"""Where one vLLM CPU replica's core goes, by process and by load: a diagnosis for the 90% cells.

The fidelity benchmark's cells at 90% load came out pessimistic (docs/fidelity-runs.md, "90% load and the
policy stage again"), and one candidate was a frontend that does less per request when the engine is
busier: an API server that falls behind its engine and serves several steps' tokens at one wake-up, or
whose per-request work shrinks with load. This script looks at the processes themselves: one replica on
core 1 (this client on core 0), rounds of an idle window, the fidelity benchmark's Poisson trace (150
requests, fresh prompts each time) at 30, 60 and 90% of the replica's measured capacity, and one
interference pair as ``llmlb calibrate`` sends it; per window, each vLLM process's CPU time (its threads'
``schedstat``, nanoseconds) and context switches, and for the replays the engine's steps read from all
requests' streams (``calibrate/fit.step_reads``) with how many of the client's reads carried more than
one step's token (a server behind its engine). Then, over the Poisson windows, each process's CPU fitted
as a part per request plus a part per step, and as a part per request plus a part per second.

    python benchmarks/vllm_process_cpu.py --rounds 3 --out cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from llmlb_bench.calibrate.endpoint import discover
from llmlb_bench.calibrate.fit import step_reads
from llmlb_bench.calibrate.probes import Prober, plan
from llmlb_bench.engines.vllm import VllmReplicas, VllmSettings, write_tiny_model
from llmlb_bench.replay import ReplayOptions, preflight
from llmlb_bench.validate import figures

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import BUDGET, SEQS, Bench, capacity, trace_at  # noqa: E402

LOADS = (0.3, 0.6, 0.9)
#: the processes of a replica, by the name each gives itself (the API server is the launcher's python)
ROLES = {"api": "python", "engine_core": "VLLM::EngineCor", "worker": "VLLM::Worker"}


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _snapshot(root: int) -> dict[tuple[int, str], np.ndarray]:
    """(pid, name) -> [CPU ns, voluntary, involuntary context switches], summed over its threads."""
    out: dict[tuple[int, str], np.ndarray] = {}
    for pid in _descendants(root):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        total = np.zeros(3, dtype=np.int64)
        for tid in tasks:
            try:
                ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            except OSError:
                continue
            vol = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
            nonvol = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
            total += np.array([ns, vol, nonvol])
        out[(pid, name)] = total
    return out


def _by_role(before: dict[tuple[int, str], np.ndarray], after: dict[tuple[int, str], np.ndarray]) -> dict[str, Any]:
    roles: dict[str, np.ndarray] = {}
    for key, now in after.items():
        role = next((r for r, prefix in ROLES.items() if key[1].startswith(prefix)), "other")
        roles[role] = roles.get(role, np.zeros(3, dtype=np.int64)) + now - before.get(key, 0)
    return {r: {"cpu_s": round(float(v[0]) / 1e9, 3), "voluntary": int(v[1]), "involuntary": int(v[2])}
            for r, v in roles.items()}


def _fit(windows: list[dict[str, Any]], role: str, per: str) -> dict[str, float]:
    """CPU = a x requests + b x ``per`` (steps or wall seconds) over the Poisson windows."""
    x = np.array([[w["requests"], w["steps"] if per == "step" else w["wall_s"]] for w in windows], dtype=float)
    y = np.array([w["processes"].get(role, {}).get("cpu_s", 0.0) for w in windows])
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    return {"per_request_ms": round(1e3 * coef[0], 2), f"per_{per}_{'us' if per == 'step' else 's'}":
            round((1e6 if per == "step" else 1.0) * coef[1], 3), "residual_max_s": round(float(np.abs(x @ coef - y).max()), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=150, help="requests per Poisson replay")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    os.sched_setaffinity(0, {0})
    out: dict[str, Any] = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "argv": sys.argv[1:],
                           "load_average_start": os.getloadavg(), "windows": []}
    with tempfile.TemporaryDirectory(prefix="llmlb-process-cpu-") as tmp:
        work = Path(tmp)
        bench = Bench(work, {})
        with VllmReplicas(write_tiny_model(work / "tiny"), 1, cores=[1],
                          settings=VllmSettings(max_num_seqs=SEQS, max_num_batched_tokens=BUDGET)) as reps:
            url, root = reps.urls[0], reps.pids()[0]
            out["capacity"] = cap = capacity(bench, url, "poisson")
            info = discover(url, {})
            options = ReplayOptions(api="completions", model=info.model)
            probes = plan(info.settings, None, None, None, 48, 1)
            prober = Prober(url, preflight([url], options), options, work / "probes")

            def window(name: str, run: Callable[[], dict[str, Any]]) -> None:
                before, t0 = _snapshot(root), time.monotonic()
                rec = {"name": name, **run()}
                rec["wall_s"] = round(time.monotonic() - t0, 3)
                rec["processes"] = _by_role(before, _snapshot(root))
                out["windows"].append(rec)
                print(json.dumps(rec), flush=True)

            def idle() -> dict[str, Any]:
                time.sleep(3.0)
                return {"requests": 0}

            def poisson(load: float) -> Callable[[], dict[str, Any]]:
                def run() -> dict[str, Any]:
                    table, path = bench.salted(trace_at("poisson", load * cap, args.requests))
                    rows = bench.replay(table, path, [url])
                    ok = [r for r in rows if r["status"] == "ok"]
                    _, counts = step_reads(ok, -math.inf, math.inf)
                    f = figures(rows)
                    return {"requests": len(rows), "ok": len(ok), "steps": int(counts.sum()),
                            "reads": int(counts.size), "bundled_reads": int((counts > 1).sum()),
                            **{k: round(1e3 * f[k], 2) for k in ("ttft_p50", "tpot_p50", "e2e_p50")}}
                return run

            def pair(k: int) -> Callable[[], dict[str, Any]]:
                def run() -> dict[str, Any]:
                    runs = prober.interference(probes, k)
                    return {"requests": sum(len(r.rows) for r in runs), "arrivals": runs[-1].params.get("arrivals")}
                return run

            window("warm-up", poisson(0.6))
            for k in range(args.rounds):
                window("idle", idle)
                for load in LOADS:
                    window(f"poisson {load:.0%}", poisson(load))
                window("interference pair", pair(k))
    out["load_average_end"] = os.getloadavg()
    replays = [w for w in out["windows"] if w["name"].startswith("poisson")]
    out["fits"] = {role: {per: _fit(replays, role, per) for per in ("step", "second")} for role in ("api", "engine_core")}
    print(json.dumps(out["fits"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
