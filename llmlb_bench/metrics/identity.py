"""What sets a run apart from the others it is compared with, read from run.json.

A run is identified by its **facets**: backend, policy (with its
arguments), cluster shape (pools of replicas x GPU, model, TP/PP; a replay's
endpoints), the workload (the trace's generating spec, else the trace file),
the rate (a sweep's rate or load, or the offered rate run.json declares), the
replay's time scale, a closed loop's users and think time, and the seeds (the trace's, and the simulator's or a
replay policy's). A report names each run by the facets whose values differ
across the runs it shows (``least_outstanding · sim seed 2``),
so three ``least_outstanding`` runs of different backends and fleets are
told apart, and joins runs into a load curve only when they differ in load
alone (every facet but the rate equal).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping

from llmlb_bench.metrics.meta import table

#: facet order in a name; ``rate`` is the load facet a curve varies. Two seeds, apart: the trace's (the seed
#: its generating spec records) and the run's own (``config.seed``: the simulator's, or in a replay the
#: routing policy's), since ``llmlb simulate trace.parquet`` runs a trace of seed 1 with seed 0
FACETS = ("policy", "backend", "cluster", "workload", "rate", "time_scale", "closed_loop", "trace_seed", "sim_seed",
          "policy_seed")
LOAD = "rate"
#: how a facet is named where its key is not its name
SHOWN = {"trace_seed": "trace seed", "sim_seed": "sim seed", "policy_seed": "policy seed", "time_scale": "time scale",
         "closed_loop": "closed loop"}


def _policy(cfg: Mapping[str, object]) -> str | None:
    p = cfg.get("policy")
    if isinstance(p, Mapping):
        extra = ",".join(f"{k}={v}" for k, v in sorted(table(p, "args").items(), key=lambda kv: kv[0]))
        name = p.get("name")
        return f"{name}({extra})" if extra else name if isinstance(name, str) else None
    return p if isinstance(p, str) else None


def _cluster(cfg: Mapping[str, object]) -> str | None:
    c = cfg.get("cluster")
    if isinstance(c, Mapping):
        pools = c.get("pools") or [c]
        parts = []
        for p in pools:
            par = f" tp{p.get('tp', 1)}" + (f"pp{p['pp']}" if (p.get("pp") or 1) > 1 else "")
            role = f" {p['role']}" if p.get("role") not in (None, "mixed") else ""
            parts.append(f"{p.get('replicas')}x{p.get('gpu')} {p.get('model')}{par}{role}")
        return " + ".join(parts)
    eps = cfg.get("endpoints")
    if isinstance(eps, list):
        models = cfg.get("models")
        model = f" {'/'.join(sorted(set(map(str, models.values()))))}" if isinstance(models, Mapping) and models else ""
        return f"{len(eps)} endpoint{'s' if len(eps) != 1 else ''}{model}"
    return None


def _workload(meta: Mapping[str, object]) -> str | None:
    sweep = table(meta, "config", "sweep")
    if sweep.get("workload"):
        return str(sweep["workload"])
    trace = table(meta, "trace")
    spec = trace.get("spec")
    if isinstance(spec, Mapping) and spec.get("name"):
        sha = trace.get("sha256")
        return str(spec["name"]) + (f"#{str(sha)[:6]}" if sha else "")
    if trace.get("path"):
        return Path(str(trace["path"])).stem
    return None


def _rate(meta: Mapping[str, object]) -> str | None:
    """The load the run was *set* to: a sweep's axis value, else a declared offered rate. A rate measured
    from the schedule is no facet: runs of one trace with dependent requests realise slightly different ones."""
    cfg = table(meta, "config")
    sweep = table(cfg, "sweep")
    if sweep.get("axis") is not None and sweep.get("x") is not None:
        return f"{sweep['axis']} {sweep['x']:g}"
    declared = cfg.get("offered_rate")
    return f"{declared:g} req/s" if isinstance(declared, (int, float)) and declared > 0 else None


def _closed_loop(cfg: Mapping[str, object]) -> str | None:
    """A closed loop's users and think time (the simulator's ``config.closed_loop``, a replay's
    ``config.options``): the same trace in a closed loop is another load than open loop."""
    loop = cfg.get("closed_loop") or cfg.get("options") or {}
    if not isinstance(loop, Mapping):
        return None
    users = loop.get("users")
    if not isinstance(users, int):
        return None
    think = loop.get("think_s") or 0
    return f"{users} users" + (f", think {think:g} s" if think else "")


def facets(meta: Mapping[str, object]) -> dict[str, str | None]:
    """Each facet's value for one run (None when run.json does not say)."""
    cfg = table(meta, "config")
    scale = table(cfg, "options").get("time_scale")
    seed = cfg.get("seed")
    sweep = table(cfg, "sweep")
    spec = table(meta, "trace").get("spec")
    trace_seed = spec.get("seed") if isinstance(spec, Mapping) else None
    label, backend = meta.get("label"), meta.get("backend")
    simulated = backend == "sim"
    return {
        "policy": _policy(cfg) or (label if isinstance(label, str) else None),
        "backend": backend if isinstance(backend, str) else None,
        "cluster": str(sweep["cluster"]) if sweep.get("cluster") else _cluster(cfg),
        "workload": _workload(meta),
        "rate": _rate(meta),
        "time_scale": None if scale in (None, 1, 1.0) else f"x{scale:g}",
        "closed_loop": _closed_loop(cfg),
        "trace_seed": None if trace_seed is None else str(trace_seed),
        "sim_seed": None if seed is None or not simulated else str(seed),
        "policy_seed": None if seed is None or simulated else str(seed),
    }


def _shown(facet: str, value: str | None) -> str:
    if facet == "policy":
        return value or "-"
    return f"{SHOWN.get(facet, facet)} {value if value is not None else '-'}"


def distinct(all_facets: Iterable[Mapping[str, str | None]]) -> list[str]:
    """The facets whose values differ among these runs, in :data:`FACETS` order."""
    rows = list(all_facets)
    return [f for f in FACETS if len({r.get(f) for r in rows}) > 1]


def names(runs: Mapping[str, Mapping[str, str | None]], labels: Mapping[str, str]) -> dict[str, str]:
    """run id -> a name made of the facets that set it apart (``labels`` when nothing does).

    Labels the user gave (``--label``: one per run, none equal to its
    policy, the default label) are kept as they are. Runs still alike in every facet (repeats under the same settings) get
    their label, then their run id, so no two names collide.
    """
    given = [labels.get(r) for r in runs]
    if all(given) and len(set(given)) == len(given) and all(labels[r] != f.get("policy") for r, f in runs.items()):
        return {r: labels[r] for r in runs}          # labels the user chose, one per run: they win
    keys = distinct(runs.values())
    out = {r: " · ".join(_shown(k, f.get(k)) for k in keys) if keys else labels.get(r) or r
           for r, f in runs.items()}
    dup = Counter(out.values())
    for r in runs:
        if dup[out[r]] > 1:
            out[r] = f"{out[r]} · {labels.get(r) or r}" if keys else r
    dup = Counter(out.values())
    return {r: (f"{n} · {r}" if dup[n] > 1 else n) for r, n in out.items()}


def without_load(f: Mapping[str, str | None]) -> str:
    """A key equal for runs that differ in load alone (the configuration of a load curve)."""
    return json.dumps({k: v for k, v in f.items() if k != LOAD}, sort_keys=True)


def common(all_facets: Iterable[Mapping[str, str | None]]) -> str:
    """What every run shares (``policy round_robin · backend sim · ...``): the context of their names."""
    rows = list(all_facets)
    keys = [f for f in FACETS if rows and len({r.get(f) for r in rows}) == 1 and rows[0].get(f) is not None]
    return " · ".join(f"{SHOWN.get(k, k)} {rows[0][k]}" for k in keys)
